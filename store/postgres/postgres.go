package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
	"github.com/idemkey/idemkey/store/waitset"
)

// Querier is the part of pgx the store uses. *pgxpool.Pool, *pgx.Conn and pgx.Tx
// satisfy it; the caller owns it (pool size, timeouts, TLS, tracing) and closes it.
//
// Statements are sent with the querier's default exec mode: with pgx's default
// (QueryExecModeCacheStatement) each statement is prepared once per connection and
// then costs one round trip. Behind a transaction-pooling proxy (PgBouncer in
// transaction mode) give New WithTransactionPooler, which sends every statement
// with QueryExecModeExec and makes Wait poll; without it a statement that meets
// the pooler fails with ErrTransactionPooler (pooler.go).
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Defaults of the options.
const (
	// DefaultTable is the records table's name when WithTable is not given.
	DefaultTable = "idemkey_records"
	// DefaultSweepBatch is the number of rows one sweep statement deletes at most.
	DefaultSweepBatch = 1000
	// maxIndexedID bounds len(Scope)+len(Key) of an ID, well below the size Postgres
	// accepts in a btree index entry (about 2.7 kB). The core's limits
	// (store.MaxScopeLen + store.MaxKeyLen, checked by ID.Validate before any I/O)
	// keep every ID under it; the assertion below fails the build if they grow.
	maxIndexedID = 2048
	// maxTableName leaves room for the "_expires_at_idx" and "_migrations" suffixes
	// within Postgres's 63-byte identifiers.
	maxTableName = 48
	// claimAttempts bounds how often Claim re-runs its statement when a concurrent
	// transaction committed the key after the statement's snapshot (docs/stores.md section 3.3).
	claimAttempts = 5
)

// Store is the Postgres idempotency store. It is safe for concurrent use; build it
// with New and create its table with Migrate (or the SQL of MigrationSQL).
type Store struct {
	db         Querier
	schema     string // unquoted, "" = search_path
	table      string // unquoted
	qualified  string // quoted, schema-qualified table name
	sweepBatch int
	maxBody    int
	logger     *slog.Logger
	part       *partitioned // the partitioned layout (WithPartitions); nil: the plain table
	readFirst  bool         // Claim reads the key's row before the claim statement (WithReadFirst)

	readSQL, claimSQL, completeSQL, completeOnceSQL, releaseSQL, renewSQL, sweepSQL, waitSQL, pollSQL string

	// execMode is sent with every statement when forceMode is set (pooler.go);
	// polling makes Wait poll with pollFirst and pollMax. Both are set by New's
	// options only.
	execMode           pgx.QueryExecMode
	forceMode, polling bool
	pollFirst, pollMax time.Duration

	// channel is the notification channel of Wait; waiters its waiters.
	channel string
	waiters waitset.Set

	// claimRetries counts claim statements re-run because of the READ COMMITTED
	// hazard (observed by tests).
	claimRetries atomic.Int64

	repl replicationPolicy // Migrate's replication check (replication.go)
}

var (
	_ store.Store  = (*Store)(nil)
	_ store.Waiter = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithReadFirst makes Claim read the key's row before it sends the claim
// statement (plain layout only; docs/stores.md section 3.2). A replay, a
// mismatch or an in-flight duplicate is then answered by that lock-free
// primary-key read instead of the claim statement; a new key, an expired record
// or a lapsed lease pays the read as one more round trip before the claim
// statement (no commit, no WAL); docs/stores.md section 3.2 has the costs. Off by
// default: turn it on where retries are frequent and Postgres answers them
// without a cache in front (the tiered store replays from its cache). The
// one-transaction mode (OneTx) honours it too: a replay or a mismatch of a
// completed key is then that read, with no transaction.
func WithReadFirst() Option { return func(s *Store) { s.readFirst = true } }

// WithTable sets the records table's name (default DefaultTable), so several
// applications can share a database. At most 48 bytes, no NUL; quoted with
// pgx.Identifier, so any other characters are safe. Migrate also creates
// "<name>_migrations" (schema versions) and the index "<name>_expires_at_idx".
func WithTable(name string) Option { return func(s *Store) { s.table = name } }

// WithSchema puts the tables in the named Postgres schema, which Migrate creates if
// needed. Default: unqualified names, resolved through the connection's search_path.
func WithSchema(name string) Option { return func(s *Store) { s.schema = name } }

// WithSweepBatch sets how many rows one sweep statement deletes at most (default
// DefaultSweepBatch). Smaller batches hold row locks for less time.
func WithSweepBatch(n int) Option { return func(s *Store) { s.sweepBatch = n } }

// WithMaxBody caps the response bodies the store keeps, in bytes: Complete refuses a
// longer body with store.ErrInvalid, and a stored body over the cap (written by a
// build with a larger cap) is reported as store.ErrCorrupt. 0 (the default) means no
// cap beyond Postgres's own 1 GB per value.
func WithMaxBody(n int) Option { return func(s *Store) { s.maxBody = n } }

// WithLogger sets the logger of the background sweeper (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.logger = l } }

// New returns a store that keeps its records in db. It does not touch the database;
// call Migrate once at startup. Errors wrap store.ErrInvalid (bad table or schema
// name, non-positive batch, negative body cap).
func New(db Querier, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("idemkey/store/postgres: %w: nil Querier", store.ErrInvalid)
	}
	s := &Store{db: db, table: DefaultTable, sweepBatch: DefaultSweepBatch, execMode: pgx.QueryExecModeExec}
	s.waiters.Idle = DefaultWaiterIdle
	for _, o := range opts {
		o(s)
	}
	switch {
	case s.table == "" || len(s.table) > maxTableName || strings.IndexByte(s.table, 0) >= 0:
		return nil, fmt.Errorf("idemkey/store/postgres: %w: table name %q must be 1-%d bytes without NUL", store.ErrInvalid, s.table, maxTableName)
	case len(s.schema) > 63 || strings.IndexByte(s.schema, 0) >= 0:
		return nil, fmt.Errorf("idemkey/store/postgres: %w: schema name %q must be at most 63 bytes without NUL", store.ErrInvalid, s.schema)
	case s.sweepBatch <= 0:
		return nil, fmt.Errorf("idemkey/store/postgres: %w: sweep batch %d must be positive", store.ErrInvalid, s.sweepBatch)
	case s.maxBody < 0:
		return nil, fmt.Errorf("idemkey/store/postgres: %w: body cap %d must not be negative", store.ErrInvalid, s.maxBody)
	}
	s.qualified = s.ident(s.table)
	t := s.qualified
	s.readSQL = fmt.Sprintf(rowSQL, t)
	s.claimSQL = fmt.Sprintf(claimSQL, t)
	s.channel = channelName(t)
	s.completeSQL = fmt.Sprintf(completeSQL+notifyReturning, t, s.channel)
	s.completeOnceSQL = fmt.Sprintf(completeOnceSQL+notifyReturning, t, s.channel)
	s.releaseSQL = fmt.Sprintf(releaseSQL+notifyReturning, t, s.channel)
	s.waitSQL = fmt.Sprintf(waitSQL, t)
	s.pollSQL = fmt.Sprintf(pollSQL, t)
	s.waiters.Listen = s.listen
	s.waiters.OnError = func(err error) {
		s.log().Warn("idemkey/store/postgres: the waiters' listening connection failed", "table", s.qualified, "err", err)
	}
	s.renewSQL = fmt.Sprintf(renewSQL, t)
	s.sweepSQL = fmt.Sprintf(sweepSQL, t)
	if err := s.useLayout(); err != nil { // partition.go
		return nil, err
	}
	return s, nil
}

// ident returns name quoted and qualified with the store's schema, if any.
func (s *Store) ident(name string) string {
	if s.schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{s.schema, name}.Sanitize()
}

// Table returns the quoted, schema-qualified name of the records table, for
// operators' queries.
func (s *Store) Table() string { return s.qualified }

// The statements, one per transition; %[1]s is the quoted table name. Durations are
// whole milliseconds ($n::bigint) and deadlines are computed from the server's now().
const (
	// claimSQL reads the key's row first (existing); only when there is none, or it
	// may be taken (past its retention, any fingerprint; or uncompleted with an
	// expired lease, same fingerprint), does it try the INSERT ... ON CONFLICT DO
	// UPDATE, whose WHERE re-checks the takeover on the newest row version. So a
	// replay, an in-flight duplicate or a mismatch is a plain read: no row lock, no
	// transaction id, no WAL. A takeover keeps created_at, which tells it apart
	// from a fresh insert in RETURNING. The last column, stale, flags an answer
	// taken from a snapshot row that the conflict check found superseded.
	claimSQL = `WITH existing AS (
    SELECT fingerprint, status, headers, body, body_omitted, created_at, completed_at, expires_at, lease_until,
           expires_at <= now() OR (status IS NULL AND lease_until <= now() AND fingerprint = $3) AS takeable
    FROM %[1]s
    WHERE scope = $1 AND key = $2
), claimed AS (
    INSERT INTO %[1]s AS r (scope, key, fingerprint, token, lease_until, created_at, expires_at)
    SELECT $1::bytea, $2::bytea, $3::bytea, $4::bytea, now() + $5::bigint * interval '1 millisecond', now(),
           now() + $6::bigint * interval '1 millisecond'
    WHERE NOT EXISTS (SELECT FROM existing WHERE takeable IS NOT TRUE)
    ON CONFLICT (scope, key) DO UPDATE SET
        fingerprint  = excluded.fingerprint,
        token        = excluded.token,
        lease_until  = excluded.lease_until,
        status       = NULL,
        headers      = NULL,
        body         = NULL,
        body_omitted = false,
        created_at   = CASE WHEN r.expires_at <= now() THEN excluded.created_at ELSE r.created_at END,
        completed_at = NULL,
        expires_at   = excluded.expires_at
    WHERE r.expires_at <= now()
       OR (r.status IS NULL AND r.lease_until <= now() AND r.fingerprint = excluded.fingerprint)
    RETURNING r.created_at < now() AS takeover
)
SELECT true, takeover, true, NULL::smallint, NULL::bytea, NULL::bytea, false,
       NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::bigint, false
FROM claimed
UNION ALL
SELECT false, false, fingerprint = $3, status,
       CASE WHEN fingerprint = $3 THEN headers END,
       CASE WHEN fingerprint = $3 THEN body END,
       body_omitted, created_at, completed_at, expires_at,
       ceil(extract(epoch FROM lease_until - now()) * 1000)::bigint,
       coalesce(takeable, false)
FROM existing
WHERE NOT EXISTS (SELECT FROM claimed)`

	holderGuard = `scope = $1 AND key = $2 AND token = $3 AND status IS NULL AND expires_at > now()`

	completeSQL = `UPDATE %[1]s SET status = $4, headers = $5, body = $6, body_omitted = $7,
    lease_until = NULL, completed_at = now(), expires_at = now() + $8::bigint * interval '1 millisecond'
WHERE ` + holderGuard

	// completeOnceSQL is Complete's: completeSQL, and a record the token completed
	// with the same status, body and omitted mark (a completion retried after its
	// reply was lost) matches too and is left as it was (the same row count, in
	// the same statement).
	completeOnceSQL = `UPDATE %[1]s SET status = $4, body = $6, body_omitted = $7, lease_until = NULL,
    headers      = CASE WHEN status IS NULL THEN $5 ELSE headers END,
    completed_at = CASE WHEN status IS NULL THEN now() ELSE completed_at END,
    expires_at   = CASE WHEN status IS NULL THEN now() + $8::bigint * interval '1 millisecond' ELSE expires_at END
WHERE scope = $1 AND key = $2 AND token = $3 AND expires_at > now()
  AND (status IS NULL OR status = $4 AND body IS NOT DISTINCT FROM $6 AND body_omitted = $7)`

	releaseSQL = `DELETE FROM %[1]s WHERE ` + holderGuard

	renewSQL = `UPDATE %[1]s SET lease_until = now() + $4::bigint * interval '1 millisecond',
    expires_at = greatest(expires_at, now() + $4::bigint * interval '1 millisecond')
WHERE ` + holderGuard

	// sweepSQL deletes one batch of expired rows: the expiry index finds and locks
	// at most $1 of them (skipping rows a claim holds locked) and a TID scan deletes
	// exactly those, so a batch never scans the table; the outer condition
	// re-checks each row deleted.
	sweepSQL = `DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM %[1]s WHERE expires_at <= now()
    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))
AND expires_at <= now()`
)

// Claim implements store.Store (see the package doc). In the plain layout it
// first reads the key's row (rowSQL, read.go): a replay, a mismatch or an
// in-flight duplicate is answered by that read alone; a new key, an expired
// record or a lapsed lease goes on to the claim statement, which decides again
// on the newest row. When a concurrent claim of the same key commits after the
// claim statement's snapshot, the statement can return no row (or a row the
// conflict check has already seen superseded); Claim then re-runs it, at most 5
// times in all, so the answer is always definite. Errors: store.ErrInvalid for bad arguments (an ID over the
// core limits, ID.Validate), store.ErrCorrupt for undecodable rows, otherwise the
// driver's error (connection, timeout, cancellation) wrapped.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if s.part != nil {
		return s.part.claim(ctx, req) // partition.go
	}
	return s.claimLoop(ctx, req, "claim", func(tok store.Token, args []any) (store.ClaimResult, bool, error) {
		var r claimRow
		err := r.scan(s.db.QueryRow(ctx, s.claimSQL, s.withMode(args...)...))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return store.ClaimResult{}, true, nil // the key was committed after our snapshot: look again
		case err != nil:
			return store.ClaimResult{}, false, fmt.Errorf("idemkey/store/postgres: claim: %w", poolerErr(err))
		case r.stale:
			return store.ClaimResult{}, true, nil // our snapshot's row was already replaced: look again
		}
		res, err := s.decide(&r, req, tok)
		return res, false, err
	})
}

// claimLoop checks req, answers it from the key's row alone when that decides
// it (WithReadFirst, plain layout: readClaim), else runs attempt with a new
// token and its claim arguments until it gives a definite answer (again
// false), at most claimAttempts times; op names the operation in the error of
// the last.
func (s *Store) claimLoop(ctx context.Context, req store.ClaimRequest, op string,
	attempt func(tok store.Token, args []any) (res store.ClaimResult, again bool, err error)) (store.ClaimResult, error) {
	if err := req.Validate(); err != nil {
		return store.ClaimResult{}, err
	}
	tok := req.ClaimToken()
	args := claimArgs(req, tok)
	if s.readFirst && s.part == nil {
		if res, decided, err := s.readClaim(ctx, req, tok, args); decided || err != nil {
			return res, err
		}
	}
	for n := range claimAttempts {
		if n > 0 {
			s.claimRetries.Add(1)
		}
		if res, again, err := attempt(tok, args); !again {
			return res, err
		}
	}
	return store.ClaimResult{}, fmt.Errorf("idemkey/store/postgres: %s: no definite answer after %d attempts under contention", op, claimAttempts)
}

// claimRow is a row of claimSQL, or the judgement of a row of rowSQL
// (keyRow.judge). stale means the answer must not be used: claimSQL's snapshot
// row was already replaced, or rowSQL's row may be taken over (claimSQL
// decides).
type claimRow struct {
	claimed, takeover, sameFP bool
	status                    pgtype.Int2
	headers, body             []byte
	omitted                   bool
	created, completed        pgtype.Timestamptz
	expires                   pgtype.Timestamptz
	retryMS                   pgtype.Int8
	stale                     bool
}

// claimArgs returns the arguments of claimSQL.
func claimArgs(req store.ClaimRequest, tok store.Token) []any {
	return []any{bytesOf(req.Scope), bytesOf(req.Key), req.Fingerprint[:], tok[:],
		codec.Millis(req.Lease), codec.Millis(req.Retention)}
}

// scan reads a row of claimSQL into r.
func (r *claimRow) scan(row pgx.Row) error { return row.Scan(r.dest()...) }

// dest returns the destinations of claimSQL's columns.
func (r *claimRow) dest() []any {
	return []any{&r.claimed, &r.takeover, &r.sameFP, &r.status, &r.headers, &r.body, &r.omitted,
		&r.created, &r.completed, &r.expires, &r.retryMS, &r.stale}
}

func (s *Store) decide(r *claimRow, req store.ClaimRequest, tok store.Token) (store.ClaimResult, error) {
	if r.claimed {
		return store.ClaimResult{Outcome: store.Claimed, Token: tok, Takeover: r.takeover}, nil
	}
	return codec.Answer(&codec.Row{
		SameFingerprint: r.sameFP,
		Completed:       r.status.Valid, Status: int(r.status.Int16),
		Headers: r.headers, Body: r.body, BodyOmitted: r.omitted,
		HasLease: r.retryMS.Valid, RetryMS: r.retryMS.Int64,
		HasTimes:  r.created.Valid && r.completed.Valid && r.expires.Valid,
		CreatedAt: r.created.Time, CompletedAt: r.completed.Time, ExpiresAt: r.expires.Time,
	}, req.Fingerprint, s.maxBody)
}

// Complete implements store.Store in one statement, guarded by the token: the
// record must be held by token, uncompleted and within its retention, otherwise
// store.ErrLeaseLost; a record token completed with the same status, body and
// omitted mark (a completion retried after its reply was lost) answers nil, left
// as it was. Bad arguments (including a body over WithMaxBody) give
// store.ErrInvalid, driver errors are wrapped. Headers are kept in the binary encoding
// of the package doc.
func (s *Store) Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := s.checkComplete(id, token, resp, retention); err != nil {
		return err
	}
	tag, err := s.exec(ctx, s.completeOnceSQL, s.completeArgs(id, token, resp, retention)...)
	return holderResult("complete", tag, err)
}

// checkComplete checks the arguments of Complete and CompleteTx (store.ErrInvalid).
func (s *Store) checkComplete(id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := checkHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateResponse(resp, retention); err != nil {
		return err
	}
	if s.maxBody > 0 && len(resp.Body) > s.maxBody {
		return fmt.Errorf("%w: body of %d bytes over the cap of %d", store.ErrInvalid, len(resp.Body), s.maxBody)
	}
	return nil
}

// completeArgs returns the arguments of completeSQL.
func (s *Store) completeArgs(id store.ID, token store.Token, resp store.Response, retention time.Duration) []any {
	var body []byte
	if len(resp.Body) > 0 {
		body = resp.Body
	}
	return []any{bytesOf(id.Scope), bytesOf(id.Key), token[:],
		int16(resp.Status), codec.EncodeHeader(resp.Header), body, resp.BodyOmitted, codec.Millis(retention)}
}

// Release implements store.Store in one statement: it deletes the record if token
// holds it uncompleted, otherwise store.ErrLeaseLost. Bad arguments give
// store.ErrInvalid, driver errors are wrapped.
func (s *Store) Release(ctx context.Context, id store.ID, token store.Token) error {
	if err := checkHolder(id, token); err != nil {
		return err
	}
	tag, err := s.exec(ctx, s.releaseSQL, bytesOf(id.Scope), bytesOf(id.Key), token[:])
	return holderResult("release", tag, err)
}

// Renew implements store.Store in one statement: the lease becomes lease from the
// server's now() (the retention is stretched if the lease would outlive it), if
// token holds the record uncompleted; otherwise store.ErrLeaseLost. Bad arguments give
// store.ErrInvalid, driver errors are wrapped.
func (s *Store) Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error {
	if err := checkHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateLease(lease); err != nil {
		return err
	}
	tag, err := s.exec(ctx, s.renewSQL, bytesOf(id.Scope), bytesOf(id.Key), token[:], codec.Millis(lease))
	return holderResult("renew", tag, err)
}

func holderResult(op string, tag pgconn.CommandTag, err error) error {
	if err != nil {
		return fmt.Errorf("idemkey/store/postgres: %s: %w", op, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("idemkey/store/postgres: %s: %w", op, store.ErrLeaseLost)
	}
	return nil
}

// Every valid ID fits the records table's btree index (see maxIndexedID).
const _ = uint(maxIndexedID - (store.MaxScopeLen + store.MaxKeyLen))

func checkHolder(id store.ID, token store.Token) error {
	return store.ValidateHolder(id, token)
}

// bytesOf returns s as a non-nil byte slice (nil would be sent as SQL NULL).
func bytesOf(s string) []byte {
	if s == "" {
		return []byte{}
	}
	return []byte(s)
}
