// Package outbox publishes messages for changes committed to Postgres, at least
// once, with a stable id: the transactional outbox, the producer's half of what
// package inbox is on the consumer's side (docs/consumers.md).
//
// A side effect outside the database (an event to other services, a receipt
// e-mail) cannot join the transaction that changes the data. Enqueue writes the
// message to the outbox table in that same transaction instead, so the message
// exists exactly when the change committed; a relay (Relay, RelayBatch) then
// reads committed messages and hands each to a publish function the caller
// supplies (a JetStream or AMQP publish: this package imports no broker), and
// deletes it once published:
//
//	tx, _ := pool.Begin(ctx)
//	_, err := tx.Exec(ctx, `INSERT INTO payments ...`)
//	_, err = ob.Enqueue(ctx, tx, outbox.Message{ID: "receipt:" + paymentID, Topic: "payments.receipts", Payload: body})
//	err = tx.Commit(ctx)                    // the payment and its message, or neither
//
//	go ob.Relay(ctx, func(ctx context.Context, m outbox.Message) error {
//		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: m.Topic, Data: m.Payload,
//			Header: nats.Header{"Nats-Msg-Id": {m.ID}}})
//		return err
//	})
//
//	change rolls back              no message: nothing is published
//	change commits                 the relay publishes the message, then deletes it
//	relay dies after publishing,   the row is still there (its transaction rolled back):
//	before its commit              published again, with the same ID
//	publish fails                  the messages published before it are deleted, the
//	                               rest stay; the relay retries after WithRetryDelay
//	publish always fails for one   it and every message after it wait (in order):
//	message (too large, no stream  Pending grows and Relay logs each failed batch;
//	takes its topic)               fix the broker or delete the row
//
// Delivery is at least once: the consumer makes it once with the message's ID,
// the broker's duplicate window (JetStream's Nats-Msg-Id) and, for good, an inbox
// (package inbox) keyed on the ID. The ID must be the same for every publish of
// one message: best a business key ("receipt:<payment id>").
//
// # Order and concurrency
//
// One relay publishes in the order of the rows' sequence numbers, taken when
// Enqueue runs (a transaction that enqueued earlier but commits later can be
// published after a later one). Several relays may run at once, in one or many processes: each batch
// locks its rows FOR UPDATE SKIP LOCKED, so they share the work without waiting
// on each other, at the price of order across batches.
//
// # Table
//
// Migrate creates (names configurable with WithTable and WithSchema):
//
//	idemkey_outbox
//	  seq        bigint identity  primary key (idemkey_outbox_pkey), publishing order
//	  message_id text       NOT NULL UNIQUE (idemkey_outbox_message_id_key)
//	  topic      text       NOT NULL
//	  payload    bytea      NOT NULL
//	  created_at timestamptz NOT NULL, start of the enqueuing transaction
//	idemkey_outbox_migrations (version, applied_at)   Migrate's bookkeeping
package outbox

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/postgres/internal/migrate"
)

// Defaults of the options.
const (
	// DefaultTable is the outbox table's name when WithTable is not given.
	DefaultTable = "idemkey_outbox"
	// DefaultBatchSize is how many messages one RelayBatch publishes at most.
	DefaultBatchSize = 100
	// DefaultPollInterval is how long Relay waits after finding nothing to publish.
	DefaultPollInterval = 200 * time.Millisecond
	// DefaultRetryDelay is how long Relay waits after a failed batch.
	DefaultRetryDelay = time.Second
	// MaxIDBytes bounds a message's ID; longer ones get store.ErrInvalid.
	MaxIDBytes = 1024
	// SchemaVersion is the newest schema version this build's Migrate installs.
	SchemaVersion = 1
	// finishTimeout bounds a batch's DELETE and COMMIT, which outlive its context.
	finishTimeout = 10 * time.Second
	// maxTableName leaves room for the "_message_id_key" suffix within
	// Postgres's 63-byte identifiers.
	maxTableName = 48
)

// Message is one message of the outbox.
type Message struct {
	// ID is the message's stable id, 1 to MaxIDBytes bytes of UTF-8 without
	// NUL: every publish of the message carries it (as JetStream's Nats-Msg-Id,
	// an AMQP message-id), and consumers deduplicate on it.
	ID string
	// Topic says where to publish it (a subject, a routing key); not empty.
	Topic string
	// Payload is the body, any bytes.
	Payload []byte
	// CreatedAt is when the enqueuing transaction started (server clock); set
	// by the relay, ignored by Enqueue.
	CreatedAt time.Time
}

// PublishFunc publishes one message to the broker and returns nil only once
// the broker has it (a JetStream PubAck, an AMQP publisher confirm): the relay
// deletes the message after that. It may be called again for a message it
// already published (after a crash or a failed commit), with the same ID.
type PublishFunc func(ctx context.Context, m Message) error

// DB is what the outbox needs of its database handle: statements, and Begin
// for the relay and Migrate. *pgxpool.Pool satisfies it.
type DB interface {
	postgres.Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Outbox is the outbox table. It is safe for concurrent use; build it with New
// and create its table with Migrate.
type Outbox struct {
	db                    DB
	schema, table         string
	qualified             string
	batch                 int
	poll, retry           time.Duration
	logger                *slog.Logger
	enqueueSQL, selectSQL string
	deleteSQL, pendingSQL string
}

// Option configures an Outbox.
type Option func(*Outbox)

// WithTable sets the table's name (default DefaultTable): 1-48 bytes, no NUL;
// Migrate also creates "<name>_pkey", "<name>_message_id_key" and "<name>_migrations".
func WithTable(name string) Option { return func(o *Outbox) { o.table = name } }

// WithSchema puts the tables in the named schema, which Migrate creates if
// needed. Default: unqualified names, resolved through the search_path.
func WithSchema(name string) Option { return func(o *Outbox) { o.schema = name } }

// WithBatchSize sets how many messages one batch publishes at most (default
// DefaultBatchSize). A batch holds its rows' locks, and one transaction, while
// it publishes.
func WithBatchSize(n int) Option { return func(o *Outbox) { o.batch = n } }

// WithPollInterval sets Relay's wait after an empty batch (default DefaultPollInterval).
func WithPollInterval(d time.Duration) Option { return func(o *Outbox) { o.poll = d } }

// WithRetryDelay sets Relay's wait after a failed batch (default DefaultRetryDelay).
func WithRetryDelay(d time.Duration) Option { return func(o *Outbox) { o.retry = d } }

// WithLogger sets where Relay logs failed batches (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *Outbox) { o.logger = l } }

// New returns an outbox over db. It does not touch the database; call Migrate
// once at startup. Errors wrap store.ErrInvalid (nil db, bad names, a
// non-positive batch size, poll interval or retry delay).
func New(db DB, opts ...Option) (*Outbox, error) {
	if db == nil {
		return nil, fmt.Errorf("idemkey/store/postgres/outbox: %w: nil DB", store.ErrInvalid)
	}
	o := &Outbox{db: db, table: DefaultTable, batch: DefaultBatchSize, poll: DefaultPollInterval, retry: DefaultRetryDelay}
	for _, opt := range opts {
		opt(o)
	}
	switch {
	case o.table == "" || len(o.table) > maxTableName || strings.IndexByte(o.table, 0) >= 0:
		return nil, fmt.Errorf("idemkey/store/postgres/outbox: %w: table name %q must be 1-%d bytes without NUL", store.ErrInvalid, o.table, maxTableName)
	case len(o.schema) > 63 || strings.IndexByte(o.schema, 0) >= 0:
		return nil, fmt.Errorf("idemkey/store/postgres/outbox: %w: schema name %q must be at most 63 bytes without NUL", store.ErrInvalid, o.schema)
	case o.batch <= 0 || o.poll <= 0 || o.retry <= 0:
		return nil, fmt.Errorf("idemkey/store/postgres/outbox: %w: batch size %d, poll interval %v and retry delay %v must be positive", store.ErrInvalid, o.batch, o.poll, o.retry)
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	o.qualified = migrate.Target{Schema: o.schema}.Ident(o.table)
	o.enqueueSQL = `INSERT INTO ` + o.qualified + ` (message_id, topic, payload) VALUES ($1, $2, $3) ON CONFLICT (message_id) DO NOTHING`
	o.selectSQL = `SELECT seq, message_id, topic, payload, created_at FROM ` + o.qualified + ` ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`
	o.deleteSQL = `DELETE FROM ` + o.qualified + ` WHERE seq = ANY($1)`
	o.pendingSQL = `SELECT count(*) FROM ` + o.qualified
	return o, nil
}

// Table returns the quoted, schema-qualified name of the outbox table.
func (o *Outbox) Table() string { return o.qualified }

// Enqueue adds m to the outbox through q, which must be the transaction that
// carries the change m tells about (a pgx.Tx): the message is published if and
// only if that transaction commits. enqueued is false when a message with m's ID
// is already waiting in the outbox (committed or in a transaction in progress,
// which Enqueue then waits for): the outbox holds one message per ID until it
// is published. Errors: a bad ID or an empty topic wraps store.ErrInvalid;
// otherwise the driver's error, wrapped (q's transaction is then aborted).
func (o *Outbox) Enqueue(ctx context.Context, q postgres.Querier, m Message) (enqueued bool, err error) {
	switch {
	case m.ID == "" || len(m.ID) > MaxIDBytes || !utf8.ValidString(m.ID) || strings.IndexByte(m.ID, 0) >= 0:
		return false, fmt.Errorf("idemkey/store/postgres/outbox: %w: message id must be 1-%d bytes of UTF-8 without NUL", store.ErrInvalid, MaxIDBytes)
	case m.Topic == "" || !utf8.ValidString(m.Topic) || strings.IndexByte(m.Topic, 0) >= 0:
		return false, fmt.Errorf("idemkey/store/postgres/outbox: %w: message %q: topic must be non-empty UTF-8 without NUL", store.ErrInvalid, m.ID)
	}
	payload := m.Payload
	if payload == nil {
		payload = []byte{}
	}
	tag, err := q.Exec(ctx, o.enqueueSQL, m.ID, m.Topic, payload)
	if err != nil {
		return false, fmt.Errorf("idemkey/store/postgres/outbox: enqueue: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// RelayBatch publishes up to the batch size of committed messages, oldest first,
// in one transaction that locks them (FOR UPDATE SKIP LOCKED: rows another relay
// holds are skipped), deletes those publish accepted and commits. It stops at
// the first message publish refuses: the messages before it are deleted, it and
// those after it stay for the next batch. It returns how many messages were
// published and deleted, and publish's error or the driver's, wrapped. If the
// commit fails, or the process dies before it, the published messages stay and
// are published again.
func (o *Outbox) RelayBatch(ctx context.Context, publish PublishFunc) (int, error) {
	if publish == nil {
		return 0, fmt.Errorf("idemkey/store/postgres/outbox: %w: nil publish func", store.ErrInvalid)
	}
	tx, err := o.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("idemkey/store/postgres/outbox: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // after Commit: does nothing
	msgs, seqs, err := o.lockBatch(ctx, tx)
	if err != nil {
		return 0, err
	}
	var pubErr error
	done := seqs[:0]
	for i, m := range msgs {
		if err := publish(ctx, m); err != nil {
			pubErr = fmt.Errorf("idemkey/store/postgres/outbox: publish %q: %w", m.ID, err)
			break
		}
		done = append(done, seqs[i])
	}
	if len(done) == 0 {
		return 0, pubErr
	}
	// What the broker has is deleted even when ctx ended meanwhile (a relay
	// stopping): not re-publishing it spares the consumers a duplicate.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	if _, err := tx.Exec(ctx, o.deleteSQL, done); err != nil {
		return 0, errors.Join(pubErr, fmt.Errorf("idemkey/store/postgres/outbox: delete published: %w", err))
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, errors.Join(pubErr, fmt.Errorf("idemkey/store/postgres/outbox: commit: %w", err))
	}
	return len(done), pubErr
}

// lockBatch reads and locks the oldest unlocked messages.
func (o *Outbox) lockBatch(ctx context.Context, tx pgx.Tx) ([]Message, []int64, error) {
	rows, err := tx.Query(ctx, o.selectSQL, o.batch)
	if err != nil {
		return nil, nil, fmt.Errorf("idemkey/store/postgres/outbox: select: %w", err)
	}
	defer rows.Close()
	var (
		msgs []Message
		seqs []int64
	)
	for rows.Next() {
		var m Message
		var seq int64
		if err := rows.Scan(&seq, &m.ID, &m.Topic, &m.Payload, &m.CreatedAt); err != nil {
			return nil, nil, fmt.Errorf("idemkey/store/postgres/outbox: scan: %w", err)
		}
		msgs, seqs = append(msgs, m), append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("idemkey/store/postgres/outbox: select: %w", err)
	}
	return msgs, seqs, nil
}

// Relay runs RelayBatch until ctx is done, then returns ctx's error: right
// after a full batch, after the poll interval when a batch found less than a
// full batch, after the retry delay (and a warning in the log) when it failed.
// Run one or more per outbox, in one or more processes.
func (o *Outbox) Relay(ctx context.Context, publish PublishFunc) error {
	if publish == nil {
		return fmt.Errorf("idemkey/store/postgres/outbox: %w: nil publish func", store.ErrInvalid)
	}
	for {
		n, err := o.RelayBatch(ctx, publish)
		wait := time.Duration(0)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			o.logger.Warn("outbox relay: batch failed; retrying", "table", o.qualified, "published", n, "retryIn", o.retry, "err", err)
			wait = o.retry
		case n < o.batch:
			wait = o.poll
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
	}
}

// Pending returns how many messages wait in the outbox, those a relay is
// publishing right now included (for monitoring: a growing number means the
// relay is down or the broker refuses).
func (o *Outbox) Pending(ctx context.Context) (int64, error) {
	var n int64
	if err := o.db.QueryRow(ctx, o.pendingSQL).Scan(&n); err != nil {
		return 0, fmt.Errorf("idemkey/store/postgres/outbox: pending: %w", err)
	}
	return n, nil
}

//go:embed migrations/*.sql
var migrationFiles embed.FS

func (o *Outbox) target() migrate.Target { return migrate.Target{Schema: o.schema, Table: o.table} }

func (o *Outbox) render(sql string) string {
	return strings.NewReplacer(
		"{{table}}", o.qualified,
		"{{pkey}}", pgx.Identifier{o.table + "_pkey"}.Sanitize(),
		"{{id_key}}", pgx.Identifier{o.table + "_message_id_key"}.Sanitize(),
	).Replace(sql)
}

// MigrationSQL returns the SQL Migrate applies, rendered for the configured
// names, for users of their own migration tool. Every statement is idempotent.
func (o *Outbox) MigrationSQL() string {
	ms, err := migrate.Load(migrationFiles, "migrations")
	if err != nil {
		return "-- " + err.Error()
	}
	return migrate.SQL(o.target(), ms, o.render)
}

// Migrate brings the outbox's schema to SchemaVersion in one transaction,
// serialised with the store's and the inbox's migrations by the same advisory
// lock. Idempotent and safe to run from several processes at once.
func (o *Outbox) Migrate(ctx context.Context) (err error) {
	ms, err := migrate.Load(migrationFiles, "migrations")
	if err != nil {
		return fmt.Errorf("idemkey/store/postgres/outbox: migrate: %w", err)
	}
	tx, err := o.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("idemkey/store/postgres/outbox: migrate: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // after Commit: does nothing
	if err = migrate.Apply(ctx, tx, true, o.target(), ms, o.render); err != nil {
		return fmt.Errorf("idemkey/store/postgres/outbox: migrate: %w", err)
	}
	if err = tx.Commit(ctx); err != nil {
		return fmt.Errorf("idemkey/store/postgres/outbox: migrate: commit: %w", err)
	}
	return nil
}
