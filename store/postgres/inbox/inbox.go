// Package inbox records processed messages in Postgres, in the same transaction
// as the handler's own changes, so a redelivered message changes nothing twice
// (docs/architecture.md section 10).
//
// A consumer applies a message like this:
//
//	outcome, err := in.Process(ctx, "payments-applier", messageID, func(ctx context.Context, tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, `INSERT INTO applied_instructions ...`, ...)
//		return err
//	})
//	switch {
//	case err != nil:                        // nothing committed: nack, the broker redelivers
//	case outcome == inbox.AlreadyProcessed: // a duplicate: ack, change nothing
//	default:                                // inbox.Applied: committed, now ack
//	}
//
// or records the message itself inside a transaction it already has, as its
// first statement, with Record.
//
//	new message                    row inserted, handler runs, one commit   Applied: ack after the commit
//	duplicate (already committed)  no row inserted, handler skipped         AlreadyProcessed: ack
//	duplicate in flight            the insert waits on the unique index for the first transaction;
//	                               first commits: AlreadyProcessed; first rolls back: Applied
//	handler fails                  the transaction rolls back, inbox row included: nack, the redelivery runs again
//
// # Which message id
//
// The id must be the same on every delivery of one logical message, and differ
// between two messages. Good choices, best first:
//   - a business key the producer sets (an instruction id, an order id, the
//     Idempotency-Key the producer was given): it survives a producer that
//     publishes the same thing twice (an outbox relay re-running after a crash,
//     a retried publish), which a broker id does not;
//   - an upstream id carried in a header (the outbox row's id, an event id);
//   - the broker's id (JetStream's Nats-Msg-Id, an AMQP message-id) only when the
//     producer sets it once per logical message and never re-publishes.
//
// Never an id that changes per attempt: a delivery tag, a JetStream sequence
// of a republish, a redelivery counter, a random id the producer draws on each
// publish or retry. Each redelivery would then look new and be applied again,
// which is the duplicate the inbox exists to stop.
//
// # Table
//
// Migrate creates (names configurable with WithTable and WithSchema):
//
//	idemkey_inbox
//	  consumer     bytea       NOT NULL   the consumer's name, any bytes
//	  message_id   bytea       NOT NULL   the message id, any bytes
//	  processed_at timestamptz NOT NULL   start of the recording transaction (server clock)
//	  CONSTRAINT idemkey_inbox_pkey PRIMARY KEY (consumer, message_id)
//	idemkey_inbox_processed_at_idx ON (processed_at)   for Sweep
//	idemkey_inbox_migrations (version, applied_at)     Migrate's bookkeeping
//
// Rows older than the retention (WithRetention, default 7 days) are removed by
// Sweep. The retention must be longer than any delay after which a duplicate
// can still arrive (the broker's redelivery window, a producer's replay), or
// that duplicate is applied again.
package inbox

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/postgres/internal/migrate"
)

// Defaults of the options.
const (
	// DefaultTable is the inbox table's name when WithTable is not given.
	DefaultTable = "idemkey_inbox"
	// DefaultRetention is how long a processed message is remembered.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultSweepBatch is the number of rows one sweep statement deletes at most.
	DefaultSweepBatch = 1000
	// MaxIDBytes bounds len(consumer)+len(message id), well below what a btree
	// index entry holds; longer ones get store.ErrInvalid.
	MaxIDBytes = 2048
	// SchemaVersion is the newest schema version this build's Migrate installs.
	SchemaVersion = 1
	// maxTableName leaves room for the "_processed_at_idx" suffix within
	// Postgres's 63-byte identifiers.
	maxTableName = 46
)

// ErrAlreadyProcessed is returned by Insert when the message was already
// recorded for the consumer: the caller's transaction is aborted and must be
// rolled back (or rolled back to a savepoint), then the message acked.
var ErrAlreadyProcessed = errors.New("idemkey/store/postgres/inbox: message already processed")

// Outcome says what Record and Process did with a message.
type Outcome uint8

const (
	// Applied: the message was new; its row is part of the transaction (and,
	// for Process, the handler's changes were committed with it).
	Applied Outcome = iota + 1
	// AlreadyProcessed: a committed transaction already recorded the message
	// for this consumer; the handler must change nothing and the message be acked.
	AlreadyProcessed
)

// String returns "applied" or "already_processed".
func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case AlreadyProcessed:
		return "already_processed"
	}
	return "unknown"
}

// DB is what the inbox needs of its database handle: statements, and Begin for
// Process and Migrate. *pgxpool.Pool, *pgx.Conn and pgx.Tx (Begin is then a
// savepoint) satisfy it.
type DB interface {
	postgres.Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Inbox is the processed-messages table of one or more consumers. It is safe for
// concurrent use; build it with New and create its table with Migrate.
type Inbox struct {
	db         DB
	schema     string
	table      string
	qualified  string
	constraint string // unquoted name of the primary key constraint
	retention  time.Duration
	sweepBatch int

	recordSQL, insertSQL, sweepSQL string
}

// Option configures an Inbox.
type Option func(*Inbox)

// WithTable sets the inbox table's name (default DefaultTable): 1-46 bytes, no
// NUL; quoted with pgx.Identifier. Migrate also creates "<name>_pkey" (the
// primary key constraint), "<name>_processed_at_idx" and "<name>_migrations".
func WithTable(name string) Option { return func(in *Inbox) { in.table = name } }

// WithSchema puts the tables in the named schema, which Migrate creates if
// needed. Default: unqualified names, resolved through the search_path.
func WithSchema(name string) Option { return func(in *Inbox) { in.schema = name } }

// WithRetention sets how long a processed message is remembered before Sweep
// removes it (default DefaultRetention; positive, millisecond precision).
func WithRetention(d time.Duration) Option { return func(in *Inbox) { in.retention = d } }

// WithSweepBatch sets how many rows one sweep statement deletes at most
// (default DefaultSweepBatch).
func WithSweepBatch(n int) Option { return func(in *Inbox) { in.sweepBatch = n } }

// New returns an inbox over db. It does not touch the database; call Migrate
// once at startup. Errors wrap store.ErrInvalid (nil db, bad table or schema
// name, non-positive retention or batch).
func New(db DB, opts ...Option) (*Inbox, error) {
	if db == nil {
		return nil, fmt.Errorf("idemkey/store/postgres/inbox: %w: nil DB", store.ErrInvalid)
	}
	in := &Inbox{db: db, table: DefaultTable, retention: DefaultRetention, sweepBatch: DefaultSweepBatch}
	for _, o := range opts {
		o(in)
	}
	switch {
	case in.table == "" || len(in.table) > maxTableName || strings.IndexByte(in.table, 0) >= 0:
		return nil, fmt.Errorf("idemkey/store/postgres/inbox: %w: table name %q must be 1-%d bytes without NUL", store.ErrInvalid, in.table, maxTableName)
	case len(in.schema) > 63 || strings.IndexByte(in.schema, 0) >= 0:
		return nil, fmt.Errorf("idemkey/store/postgres/inbox: %w: schema name %q must be at most 63 bytes without NUL", store.ErrInvalid, in.schema)
	case in.retention < time.Millisecond:
		return nil, fmt.Errorf("idemkey/store/postgres/inbox: %w: retention %v must be at least 1ms", store.ErrInvalid, in.retention)
	case in.sweepBatch <= 0:
		return nil, fmt.Errorf("idemkey/store/postgres/inbox: %w: sweep batch %d must be positive", store.ErrInvalid, in.sweepBatch)
	}
	in.constraint = in.table + "_pkey"
	if in.schema == "" {
		in.qualified = pgx.Identifier{in.table}.Sanitize()
	} else {
		in.qualified = pgx.Identifier{in.schema, in.table}.Sanitize()
	}
	in.recordSQL = fmt.Sprintf(recordSQL, in.qualified)
	in.insertSQL = fmt.Sprintf(insertSQL, in.qualified)
	in.sweepSQL = fmt.Sprintf(sweepSQL, in.qualified)
	return in, nil
}

// Table returns the quoted, schema-qualified name of the inbox table.
func (in *Inbox) Table() string { return in.qualified }

// Constraint returns the (unquoted) name of the primary key constraint that
// IsDuplicate recognises.
func (in *Inbox) Constraint() string { return in.constraint }

const (
	// recordSQL inserts the row unless it exists. A concurrent transaction that
	// inserted the same row and has not committed makes it wait on the unique
	// index; after that one commits it sees the conflict and inserts nothing,
	// without an error, so the caller's transaction stays usable.
	recordSQL = `INSERT INTO %s (consumer, message_id) VALUES ($1, $2) ON CONFLICT (consumer, message_id) DO NOTHING`
	insertSQL = `INSERT INTO %s (consumer, message_id) VALUES ($1, $2)`
	sweepSQL  = `DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM %[1]s WHERE processed_at < now() - $1::bigint * interval '1 millisecond'
    ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED))
AND processed_at < now() - $1::bigint * interval '1 millisecond'`
)

func checkID(consumer, messageID string) error {
	switch {
	case consumer == "":
		return fmt.Errorf("idemkey/store/postgres/inbox: %w: empty consumer name", store.ErrInvalid)
	case messageID == "":
		return fmt.Errorf("idemkey/store/postgres/inbox: %w: empty message id", store.ErrInvalid)
	case len(consumer)+len(messageID) > MaxIDBytes:
		return fmt.Errorf("idemkey/store/postgres/inbox: %w: consumer and message id are %d bytes, over %d", store.ErrInvalid, len(consumer)+len(messageID), MaxIDBytes)
	}
	return nil
}

// Record inserts (consumer, messageID) into the inbox through q, which must be
// the transaction that also carries the handler's changes (a pgx.Tx), so both
// commit or neither does. Call it first in the transaction: a concurrent
// delivery of the same message then waits here until the first transaction
// ends, and never runs the handler alongside it.
//
// Applied means the message is new and the handler should run; AlreadyProcessed
// means a committed transaction recorded it: skip the handler, end the
// transaction and ack. A duplicate never aborts q's transaction. Errors: an
// empty or over-long id wraps store.ErrInvalid; otherwise the driver's error
// (the transaction is then aborted: roll back and nack).
func (in *Inbox) Record(ctx context.Context, q postgres.Querier, consumer, messageID string) (Outcome, error) {
	if err := checkID(consumer, messageID); err != nil {
		return 0, err
	}
	tag, err := q.Exec(ctx, in.recordSQL, []byte(consumer), []byte(messageID))
	if err != nil {
		return 0, fmt.Errorf("idemkey/store/postgres/inbox: record: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return AlreadyProcessed, nil
	}
	return Applied, nil
}

// Process runs fn and records the message in one transaction begun on the
// inbox's DB: Record first, then fn only for a new message, then the commit.
// It returns Applied once committed, AlreadyProcessed (fn not called, nothing
// committed) for a duplicate, and for any error (fn's, unchanged and wrapped
// by nothing else, or the driver's, wrapped) nothing is committed: nack the
// message. A nil fn wraps store.ErrInvalid. A failed commit may still have
// committed; the redelivery then finds the message processed. A panicking fn
// rolls the transaction back, then the panic goes on.
func (in *Inbox) Process(ctx context.Context, consumer, messageID string, fn func(ctx context.Context, tx pgx.Tx) error) (outcome Outcome, err error) {
	if err := checkID(consumer, messageID); err != nil {
		return 0, err
	}
	if fn == nil {
		return 0, fmt.Errorf("idemkey/store/postgres/inbox: %w: nil handler", store.ErrInvalid)
	}
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("idemkey/store/postgres/inbox: begin: %w", err)
	}
	committed := false
	defer func() {
		// Every way out but a commit rolls back, a panicking fn included: an open
		// transaction would keep its pool connection and the inbox row's lock,
		// and the redelivery would wait on that lock forever.
		if !committed {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if outcome, err = in.Record(ctx, tx, consumer, messageID); err != nil || outcome == AlreadyProcessed {
		return outcome, err
	}
	if err = fn(ctx, tx); err != nil {
		return 0, err
	}
	committed = true // a failed Commit has ended the transaction too
	if err = tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("idemkey/store/postgres/inbox: commit: %w", err)
	}
	return Applied, nil
}

// InsertSQL returns the plain insert ($1 consumer, $2 message id, both bytea)
// for callers that prefer it to Record's ON CONFLICT DO NOTHING, e.g. inside
// their own statement batch. A duplicate then fails with a unique violation
// that aborts the transaction; recognise it with IsDuplicate.
func (in *Inbox) InsertSQL() string { return in.insertSQL }

// Insert runs InsertSQL through q. A duplicate returns an error matching
// ErrAlreadyProcessed (q's transaction is then aborted: roll back, or roll
// back to a savepoint taken before, and ack); any other error is the driver's,
// wrapped.
func (in *Inbox) Insert(ctx context.Context, q postgres.Querier, consumer, messageID string) error {
	if err := checkID(consumer, messageID); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, in.insertSQL, []byte(consumer), []byte(messageID)); err != nil {
		if in.IsDuplicate(err) {
			return fmt.Errorf("%w: %w", ErrAlreadyProcessed, err)
		}
		return fmt.Errorf("idemkey/store/postgres/inbox: insert: %w", err)
	}
	return nil
}

// IsDuplicate reports whether err is a unique violation (SQLSTATE 23505) of
// this inbox's primary key constraint, by its name: a unique violation of any
// other constraint, the caller's own tables included, is not a duplicate
// message and must not be acked as one.
func (in *Inbox) IsDuplicate(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "23505" && pg.ConstraintName == in.constraint &&
		(in.schema == "" || pg.SchemaName == "" || pg.SchemaName == in.schema)
}

// Sweep deletes rows older than the retention (server clock), at most limit of
// them (limit <= 0: all), in statements of at most the sweep batch size, each
// skipping rows locked by a transaction in progress. It returns how many rows
// it deleted; on a driver error, those deleted so far and the error, wrapped.
func (in *Inbox) Sweep(ctx context.Context, limit int) (int64, error) {
	ms := int64(in.retention / time.Millisecond)
	var total int64
	for limit <= 0 || total < int64(limit) {
		n := int64(in.sweepBatch)
		if limit > 0 {
			n = min(n, int64(limit)-total)
		}
		tag, err := in.db.Exec(ctx, in.sweepSQL, ms, n)
		if err != nil {
			return total, fmt.Errorf("idemkey/store/postgres/inbox: sweep: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < n {
			break
		}
	}
	return total, nil
}

//go:embed migrations/*.sql
var migrationFiles embed.FS

func migrations() ([]migrate.Migration, error) { return migrate.Load(migrationFiles, "migrations") }

func (in *Inbox) target() migrate.Target { return migrate.Target{Schema: in.schema, Table: in.table} }

func (in *Inbox) render(sql string) string {
	return strings.NewReplacer(
		"{{table}}", in.qualified,
		"{{pkey}}", pgx.Identifier{in.constraint}.Sanitize(),
		"{{processed_index}}", pgx.Identifier{in.table + "_processed_at_idx"}.Sanitize(),
	).Replace(sql)
}

// MigrationSQL returns the SQL Migrate applies, rendered for the configured
// names, for users of their own migration tool (without Migrate's bookkeeping
// table). Every statement is idempotent.
func (in *Inbox) MigrationSQL() string {
	ms, err := migrations()
	if err != nil {
		return "-- " + err.Error()
	}
	return migrate.SQL(in.target(), ms, in.render)
}

// Migrate brings the inbox's schema to SchemaVersion in one transaction,
// serialised with the idempotency store's migrations by the same advisory lock
// on the schema (the table when no schema is configured): it creates the schema
// if one is configured, the bookkeeping table "<table>_migrations" and applies
// the embedded migrations not yet recorded there. Idempotent and safe to run
// from several processes at once; a table dropped by hand is created again.
func (in *Inbox) Migrate(ctx context.Context) (err error) {
	ms, err := migrations()
	if err != nil {
		return fmt.Errorf("idemkey/store/postgres/inbox: migrate: %w", err)
	}
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("idemkey/store/postgres/inbox: migrate: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err = migrate.Apply(ctx, tx, true, in.target(), ms, in.render); err != nil {
		return fmt.Errorf("idemkey/store/postgres/inbox: migrate: %w", err)
	}
	if err = tx.Commit(ctx); err != nil {
		return fmt.Errorf("idemkey/store/postgres/inbox: migrate: commit: %w", err)
	}
	return nil
}
