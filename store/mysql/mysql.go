package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
	"github.com/idemkey/idemkey/store/waitset"
)

// Defaults and limits of the options.
const (
	// DefaultTable is the records table's name when WithTable is not given.
	DefaultTable = "idemkey_records"
	// DefaultSweepBatch is the number of rows one sweep statement deletes at most.
	DefaultSweepBatch = 1000
	// maxTableName leaves room for the "_migrations" suffix within the 64-byte
	// identifiers of MySQL and MariaDB.
	maxTableName = 48
	// claimAttempts bounds how often Claim looks again: after its INSERT found the
	// key taken by a concurrent claim (then the read answers), or InnoDB chose it
	// as the victim of a deadlock between concurrent inserts of the same new key.
	claimAttempts = 8
)

// Store is the MySQL/MariaDB idempotency store. It is safe for concurrent use;
// build it with New, create its table with Migrate (or the SQL of MigrationSQL)
// and Close it after the last request (it closes its prepared statements, not
// the *sql.DB).
type Store struct {
	db           *sql.DB
	table        string // unquoted
	quoted       string // quoted with backticks
	sweepBatch   int
	maxBody      int
	logger       *slog.Logger
	pollFirst    time.Duration
	pollMax      time.Duration
	sqlOf        statements
	stmts        stmtCache
	claimRetries atomic.Int64
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Waiter    = (*Store)(nil)
	_ store.Inspector = (*Store)(nil)
	_ store.Pinger    = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithTable sets the records table's name (default DefaultTable), so several
// applications can share a database. 1-48 bytes, no NUL, not ending in a space
// (MySQL refuses such names); quoted with backticks, so any other characters
// are safe. Migrate also creates "<name>_migrations" (schema versions).
func WithTable(name string) Option { return func(s *Store) { s.table = name } }

// WithSweepBatch sets how many rows one sweep statement deletes at most (default
// DefaultSweepBatch). Smaller batches hold row locks for less time.
func WithSweepBatch(n int) Option { return func(s *Store) { s.sweepBatch = n } }

// WithMaxBody caps the response bodies the store keeps, in bytes: Complete refuses
// a longer body with store.ErrInvalid, and a stored body over the cap is reported
// as store.ErrCorrupt. 0 (the default) means no cap beyond the server's
// max_allowed_packet (16 MiB by default on MariaDB, 64 MiB on MySQL 8), which a
// larger body exceeds with the driver's error.
func WithMaxBody(n int) Option { return func(s *Store) { s.maxBody = n } }

// WithLogger sets the logger of the background sweeper (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.logger = l } }

// WithPollInterval sets the back-off of Wait, which polls the key's row (the
// server has no notifications): the first re-check after first, each next one
// twice as late, at most max apart. Defaults waitset.DefaultPollFirst (5 ms) and
// waitset.DefaultPollMax (250 ms); both must be positive, max at least first.
func WithPollInterval(first, max time.Duration) Option {
	return func(s *Store) { s.pollFirst, s.pollMax = first, max }
}

// New returns a store that keeps its records in db, a pool opened with
// sql.Open("mysql", dsn) (github.com/go-sql-driver/mysql) in autocommit mode (the
// driver's default). It does not touch the database; call Migrate once at
// startup. Errors wrap store.ErrInvalid (nil db, bad table name, non-positive
// batch or poll interval, negative body cap).
func New(db *sql.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("idemkey/store/mysql: %w: nil *sql.DB", store.ErrInvalid)
	}
	s := &Store{db: db, table: DefaultTable, sweepBatch: DefaultSweepBatch,
		pollFirst: waitset.DefaultPollFirst, pollMax: waitset.DefaultPollMax}
	for _, o := range opts {
		o(s)
	}
	switch {
	case s.table == "" || len(s.table) > maxTableName || strings.IndexByte(s.table, 0) >= 0 || strings.HasSuffix(s.table, " "):
		return nil, fmt.Errorf("idemkey/store/mysql: %w: table name %q must be 1-%d bytes without NUL or a trailing space", store.ErrInvalid, s.table, maxTableName)
	case s.sweepBatch <= 0:
		return nil, fmt.Errorf("idemkey/store/mysql: %w: sweep batch %d must be positive", store.ErrInvalid, s.sweepBatch)
	case s.maxBody < 0:
		return nil, fmt.Errorf("idemkey/store/mysql: %w: body cap %d must not be negative", store.ErrInvalid, s.maxBody)
	case s.pollFirst <= 0 || s.pollMax < s.pollFirst:
		return nil, fmt.Errorf("idemkey/store/mysql: %w: poll interval %v up to %v: both must be positive, the second at least the first", store.ErrInvalid, s.pollFirst, s.pollMax)
	}
	s.quoted = quote(s.table)
	s.sqlOf = newStatements(s.quoted)
	s.stmts.db = db
	return s, nil
}

// quote returns name as a MySQL identifier: in backticks, inner backticks doubled.
func quote(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

// Table returns the quoted name of the records table, for operators' queries.
func (s *Store) Table() string { return s.quoted }

// Close closes the store's prepared statements (not the *sql.DB, which the
// caller owns). Calls after Close prepare them again.
func (s *Store) Close() error { return s.stmts.close() }

// Complete implements store.Store in one statement, guarded by the token: the
// record must be held by token, uncompleted and within its retention, otherwise
// store.ErrLeaseLost; after a refusal one read tells a record token completed
// with the same status, body and omitted mark (a completion retried after its
// reply was lost), answered nil. A deadlock victim (error 1213; on Galera a
// certification conflict) is sent again, three tries in all. Bad arguments (including a body over WithMaxBody) give
// store.ErrInvalid, driver errors are wrapped.
func (s *Store) Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := s.checkComplete(id, token, resp, retention); err != nil {
		return err
	}
	st, err := s.stmts.get(ctx, s.sqlOf.complete)
	if err != nil {
		return fmt.Errorf("idemkey/store/mysql: complete: %w", err)
	}
	res, err := st.ExecContext(ctx, completeArgs(id, token, resp, retention)...)
	for try := 1; isDeadlock(err) && try < 3; try++ {
		// A deadlock victim was rolled back whole (on Galera, a certification
		// conflict with a write set being applied): the fenced UPDATE is safe to
		// send again, and an already applied one is answered by completedBy.
		res, err = st.ExecContext(ctx, completeArgs(id, token, resp, retention)...)
	}
	if err = holderResult("complete", res, err); errors.Is(err, store.ErrLeaseLost) {
		return s.completedBy(ctx, id, token, resp, err)
	}
	return err
}

// completedBy answers a refused completion (refused, wrapping ErrLeaseLost): nil
// when token completed the record with resp's status, body and omitted mark
// already (a completion retried after its reply was lost), refused when not, the
// read's error when it failed.
func (s *Store) completedBy(ctx context.Context, id store.ID, token store.Token, resp store.Response, refused error) error {
	st, err := s.stmts.get(ctx, s.sqlOf.completed)
	if err != nil {
		return fmt.Errorf("idemkey/store/mysql: complete: %w", err)
	}
	var body []byte // NULL when empty, as stored
	if len(resp.Body) > 0 {
		body = resp.Body
	}
	var n int
	if err := st.QueryRowContext(ctx, bytesOf(id.Scope), bytesOf(id.Key), token[:], int16(resp.Status), body, resp.BodyOmitted).Scan(&n); err != nil {
		return fmt.Errorf("idemkey/store/mysql: complete: %w", err)
	}
	if n > 0 {
		return nil
	}
	return refused
}

// checkComplete checks the arguments of Complete and CompleteTx (store.ErrInvalid).
func (s *Store) checkComplete(id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
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

// completeArgs returns the arguments of the complete statement.
func completeArgs(id store.ID, token store.Token, resp store.Response, retention time.Duration) []any {
	var body []byte // NULL when empty
	if len(resp.Body) > 0 {
		body = resp.Body
	}
	return []any{int16(resp.Status), codec.EncodeHeader(resp.Header), body, resp.BodyOmitted, micros(retention),
		bytesOf(id.Scope), bytesOf(id.Key), token[:]}
}

// Release implements store.Store in one statement: it deletes the record if token
// holds it uncompleted, otherwise store.ErrLeaseLost. Bad arguments give
// store.ErrInvalid, driver errors are wrapped.
func (s *Store) Release(ctx context.Context, id store.ID, token store.Token) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	st, err := s.stmts.get(ctx, s.sqlOf.release)
	if err != nil {
		return fmt.Errorf("idemkey/store/mysql: release: %w", err)
	}
	res, err := st.ExecContext(ctx, bytesOf(id.Scope), bytesOf(id.Key), token[:])
	return holderResult("release", res, err)
}

// Renew implements store.Store in one statement: the lease becomes lease from the
// server's clock (the retention is stretched if the lease would outlive it), if
// token holds the record uncompleted; otherwise store.ErrLeaseLost. Bad arguments
// give store.ErrInvalid, driver errors are wrapped.
func (s *Store) Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateLease(lease); err != nil {
		return err
	}
	st, err := s.stmts.get(ctx, s.sqlOf.renew)
	if err != nil {
		return fmt.Errorf("idemkey/store/mysql: renew: %w", err)
	}
	us := micros(lease)
	res, err := st.ExecContext(ctx, us, us, bytesOf(id.Scope), bytesOf(id.Key), token[:])
	return holderResult("renew", res, err)
}

// holderResult maps a token-guarded statement's result: no row changed means the
// token no longer holds the key.
func holderResult(op string, res sql.Result, err error) error {
	if err != nil {
		return fmt.Errorf("idemkey/store/mysql: %s: %w", op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idemkey/store/mysql: %s: %w", op, err)
	}
	if n == 0 {
		return fmt.Errorf("idemkey/store/mysql: %s: %w", op, store.ErrLeaseLost)
	}
	return nil
}

// micros is d in whole milliseconds, rounded up (codec.Millis, as every store
// keeps them), expressed in microseconds for the server's INTERVAL arithmetic.
func micros(d time.Duration) int64 { return codec.Millis(d) * 1000 }

// bytesOf returns s as a non-nil byte slice (nil would be sent as SQL NULL).
func bytesOf(s string) []byte {
	if s == "" {
		return []byte{}
	}
	return []byte(s)
}

// stmtCache prepares each statement once per store (database/sql then prepares
// it on each connection at its first use there), so every call is one round
// trip whatever the DSN's interpolateParams.
type stmtCache struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

func (c *stmtCache) get(ctx context.Context, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	st := c.m[query]
	c.mu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[query]; old != nil {
		_ = st.Close()
		return old, nil
	}
	if c.m == nil {
		c.m = make(map[string]*sql.Stmt)
	}
	c.m[query] = st
	return st, nil
}

func (c *stmtCache) close() error {
	c.mu.Lock()
	m := c.m
	c.m = nil
	c.mu.Unlock()
	var errs []error
	for _, st := range m {
		errs = append(errs, st.Close())
	}
	return errors.Join(errs...)
}

func (s *Store) log() *slog.Logger {
	if s.logger != nil {
		return s.logger
	}
	return slog.Default()
}
