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
// WithTransactionPooler fixes both up front. Without it the store detects them:
// the first 26000 or 42P05 error switches every later statement to
// QueryExecModeExec (the failed statement did not run and is sent again, except
// inside the caller's transaction, which the error has aborted), and a listening
// connection that does not receive its own probe notification within
// ListenProbeTimeout switches Wait to polling. Both are logged once (WithLogger).

// ListenProbeTimeout bounds how long a new listening connection waits for its
// own probe notification before Wait concludes that notifications cannot arrive
// (a transaction pooler) and polls instead.
const ListenProbeTimeout = 2 * time.Second

// probePrefix starts the payload of the listener's probe; a key's payload is 64
// hex digits, so they never collide.
const probePrefix = "probe:"

// WithQueryExecMode sends every statement of the store (CompleteTx's too) with
// mode, whatever the Querier's default: pgx.QueryExecModeExec or
// pgx.QueryExecModeSimpleProtocol behind a transaction pooler, which cannot keep
// prepared statements. Default: the Querier's own mode (pgx's statement cache
// unless configured otherwise), until a pooler is detected.
func WithQueryExecMode(mode pgx.QueryExecMode) Option {
	return func(s *Store) { s.execMode = mode; s.forceMode.Store(true) }
}

// WithPolledWait makes Wait poll the key's row (one SELECT by primary key) with
// back-off, the first re-check after first, doubling up to max (0: the
// waitset defaults, 5 ms and 250 ms), instead of listening for notifications:
// for a Querier whose connections are shared by transaction (PgBouncer's
// transaction mode), or any Querier that is not a *pgxpool.Pool.
func WithPolledWait(first, max time.Duration) Option {
	return func(s *Store) { s.pollFirst, s.pollMax = first, max; s.polling.Store(true) }
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
	if !s.forceMode.Load() {
		return args
	}
	return append([]any{s.execMode}, args...)
}

// isPoolerStatementError reports an error of pgx's statement cache behind a
// transaction pooler: the statement was not run.
func isPoolerStatementError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "42P05")
}

// detectPooler switches the store to QueryExecModeExec after a statement-cache
// error; it reports whether the caller should send the statement again (also
// when a concurrent call switched first: this one was sent with the cache).
func (s *Store) detectPooler(err error) bool {
	if !isPoolerStatementError(err) {
		return false
	}
	if s.forceMode.CompareAndSwap(false, true) {
		s.log().Warn("idemkey/postgres: prepared statements do not survive between statements (a transaction pooler such as PgBouncer?): sending every statement with QueryExecModeExec; configure WithTransactionPooler to skip this", "table", s.qualified, "err", err)
	}
	return true
}

// exec runs one statement of the store with the forced exec mode, sending it
// again once if it revealed a transaction pooler.
func (s *Store) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := s.db.Exec(ctx, sql, s.withMode(args...)...)
	if err != nil && s.detectPooler(err) {
		tag, err = s.db.Exec(ctx, sql, s.withMode(args...)...)
	}
	return tag, err
}

// queryRow runs one single-row statement of the store and scans it, as exec.
func (s *Store) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	err := s.db.QueryRow(ctx, sql, s.withMode(args...)...).Scan(dest...)
	if err != nil && s.detectPooler(err) {
		err = s.db.QueryRow(ctx, sql, s.withMode(args...)...).Scan(dest...)
	}
	return err
}

// pollSQL is the polling Wait's look: does the key hold a live claim? A plain
// read, no flag written (nobody will be notified).
const pollSQL = `SELECT EXISTS (SELECT FROM %[1]s
WHERE scope = $1 AND key = $2 AND status IS NULL AND lease_until > now() AND expires_at > now())`

// pollWait is Wait by polling (WithPolledWait, or a detected pooler).
func (s *Store) pollWait(ctx context.Context, id store.ID) error {
	scope, key := bytesOf(id.Scope), bytesOf(id.Key)
	return waitset.Poll(ctx, s.pollFirst, s.pollMax, func(ctx context.Context) (bool, error) {
		var live bool
		if err := s.queryRow(ctx, s.pollSQL, []any{scope, key}, &live); err != nil {
			return false, fmt.Errorf("idemkey/postgres: wait: %w", err)
		}
		return live, nil
	})
}

// probeListener sends a notification to the store's channel through the Querier
// and waits up to ListenProbeTimeout for it on conn, which listens; the
// notifications of waited keys that arrive meanwhile are delivered. False means
// notifications do not reach conn: Wait polls from now on.
func (s *Store) probeListener(ctx context.Context, conn *pgx.Conn, deliver func(*pgconn.Notification)) (bool, error) {
	probe := probePrefix + store.NewToken().String()
	if _, err := s.exec(ctx, `SELECT pg_notify($1, $2)`, s.channel, probe); err != nil {
		return false, err
	}
	pctx, cancel := context.WithTimeout(ctx, ListenProbeTimeout)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(pctx)
		switch {
		case err != nil && ctx.Err() == nil && pctx.Err() != nil:
			s.polling.Store(true)
			s.log().Warn("idemkey/postgres: the listening connection does not receive notifications (a transaction pooler such as PgBouncer?): Wait polls from now on; configure WithTransactionPooler to skip this", "table", s.qualified)
			return false, nil
		case err != nil:
			return false, err
		case n.Channel == s.channel && n.Payload == probe:
			return true, nil
		}
		deliver(n)
	}
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
