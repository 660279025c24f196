package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/waitset"
)

// Behind a transaction-pooling proxy (PgBouncer with pool_mode = transaction)
// consecutive statements of one client connection run on different server
// connections, which breaks two things the store does by default (docs/scaling.md):
//
//   - pgx's statement cache: a statement prepared on one server connection is
//     missing on the next ("prepared statement ... does not exist", SQLSTATE
//     26000) or already taken there by another client ("already exists", 42P05);
//   - Wait's LISTEN: the server connection that ran it goes back to the pool, and
//     its notifications never reach the listening client.
//
// WithTransactionPooler configures both up front; the store never guesses. A
// statement that fails with 26000 or 42P05 is answered ErrTransactionPooler
// (wrapping the driver's error), so the first request behind an unconfigured
// pooler says what to configure instead of failing at random.

// ErrTransactionPooler is wrapped by the error of a statement that failed
// because prepared statements do not survive between statements: a
// transaction pooler (PgBouncer in transaction mode) that the store was not
// configured for. Give New WithTransactionPooler.
var ErrTransactionPooler = errors.New("idemkey/store/postgres: prepared statements do not survive between statements (a transaction pooler such as PgBouncer in transaction mode?): configure WithTransactionPooler")

// WithQueryExecMode sends every statement of the store (CompleteTx's too) with
// mode, whatever the Querier's default: pgx.QueryExecModeExec or
// pgx.QueryExecModeSimpleProtocol behind a transaction pooler, which cannot keep
// prepared statements. Default: the Querier's own mode (pgx's statement cache
// unless configured otherwise).
func WithQueryExecMode(mode pgx.QueryExecMode) Option {
	return func(s *Store) { s.execMode, s.forceMode = mode, true }
}

// WithPolledWait makes Wait poll the key's row (one SELECT by primary key) with
// back-off, the first re-check after first, doubling up to max (0: the
// waitset defaults, 5 ms and 250 ms), instead of listening for notifications:
// for a Querier whose connections are shared by transaction (PgBouncer's
// transaction mode), or any Querier that is not a *pgxpool.Pool.
func WithPolledWait(first, max time.Duration) Option {
	return func(s *Store) { s.pollFirst, s.pollMax, s.polling = first, max, true }
}

// WithTransactionPooler configures the store for a transaction-pooling proxy
// such as PgBouncer in transaction mode: statements with pgx.QueryExecModeExec
// (one round trip, no server-side statement) and Wait by polling
// (WithPolledWait with the defaults).
func WithTransactionPooler() Option {
	return func(s *Store) {
		WithQueryExecMode(pgx.QueryExecModeExec)(s)
		WithPolledWait(0, 0)(s)
	}
}

// withMode returns args behind the forced exec mode, if any.
func (s *Store) withMode(args ...any) []any {
	if !s.forceMode {
		return args
	}
	return append([]any{s.execMode}, args...)
}

// poolerErr returns err, wrapped with ErrTransactionPooler when it is an error of
// pgx's statement cache behind a transaction pooler (the statement did not run).
func poolerErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "42P05") {
		return fmt.Errorf("%w: %w", ErrTransactionPooler, err)
	}
	return err
}

// exec runs one statement of the store with the forced exec mode, if any.
func (s *Store) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := s.db.Exec(ctx, sql, s.withMode(args...)...)
	return tag, poolerErr(err)
}

// queryRow runs one single-row statement of the store and scans it, as exec.
func (s *Store) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	return poolerErr(s.db.QueryRow(ctx, sql, s.withMode(args...)...).Scan(dest...))
}

// pollSQL is the polling Wait's look: does the key hold a live claim? A plain
// read, no flag written (nobody will be notified).
const pollSQL = `SELECT EXISTS (SELECT FROM %[1]s
WHERE scope = $1 AND key = $2 AND status IS NULL AND lease_until > now() AND expires_at > now())`

// pollWait is Wait by polling (WithPolledWait).
func (s *Store) pollWait(ctx context.Context, id store.ID) error {
	scope, key := bytesOf(id.Scope), bytesOf(id.Key)
	return waitset.Poll(ctx, s.pollFirst, s.pollMax, func(ctx context.Context) (bool, error) {
		var live bool
		if err := s.queryRow(ctx, s.pollSQL, []any{scope, key}, &live); err != nil {
			return false, fmt.Errorf("idemkey/store/postgres: wait: %w", err)
		}
		return live, nil
	})
}

// modeQuerier sends Migrate's statements with the store's forced exec mode.
type modeQuerier struct {
	q Querier
	s *Store
}

func (m modeQuerier) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if len(args) == 0 { // no arguments: the simple protocol, several statements at once
		return m.q.Exec(ctx, sql)
	}
	return m.q.Exec(ctx, sql, m.s.withMode(args...)...)
}

func (m modeQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return m.q.QueryRow(ctx, sql, m.s.withMode(args...)...)
}
