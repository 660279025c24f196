package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
)

// DefaultLockWait is how long a duplicate waits for the record's row lock in
// one-transaction mode (WithLockWait) before it is answered in flight (409).
const DefaultLockWait = time.Second

// endTimeout bounds the ROLLBACK that ends a transaction no handler runs in.
const endTimeout = 5 * time.Second

// firstClaimSQL is the first claim of a one-transaction request (%[1]s the
// quoted table name; the arguments and columns of claimSQL): a plain INSERT
// ... ON CONFLICT DO NOTHING, and only when it inserted nothing a read of the
// row in its way, from the statement's snapshot. A new key costs the insert
// alone (the read is skipped by its one-time NOT EXISTS filter); a replay,
// mismatch or duplicate reads without a lock; a key committed after the
// snapshot gives no row, and a row that may be taken over (takeable, the last
// column) is left to the next attempt's claimSQL, which takes it over.
const firstClaimSQL = `WITH claimed AS (
    INSERT INTO %[1]s (scope, key, fingerprint, token, lease_until, created_at, expires_at)
    VALUES ($1, $2, $3, $4, now() + $5::bigint * interval '1 millisecond', now(),
            now() + $6::bigint * interval '1 millisecond')
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING true
)
SELECT true, false, true, NULL::smallint, NULL::bytea, NULL::bytea, false,
       NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::bigint, false
FROM claimed
UNION ALL
SELECT false, false, fingerprint = $3, status,
       CASE WHEN fingerprint = $3 THEN headers END,
       CASE WHEN fingerprint = $3 THEN body END,
       body_omitted, created_at, completed_at, expires_at,
       ceil(extract(epoch FROM lease_until - now()) * 1000)::bigint,
       expires_at <= now() OR (status IS NULL AND lease_until <= now() AND fingerprint = $3)
FROM %[1]s
WHERE scope = $1 AND key = $2 AND NOT EXISTS (SELECT FROM claimed)`

// TxStore is the store's one-transaction mode (docs/architecture.md section 9.1):
// on the routes wrapped with Route, the claim, the handler's statements and the
// completion run in one transaction and commit once. Its INSERT ... ON CONFLICT
// takes the record's row lock; a concurrent duplicate blocks on it for at most
// the lock wait (WithLockWait, a local lock_timeout) and then finds the committed
// record (replay) or is answered in flight (409). The transaction is the lease
// and the fence: nothing is renewed, a crash aborts it and frees the key, and a
// handler that answers 5xx rolls it back.
//
// On every other route it is the plain Store it embeds (claim committed first,
// lease renewed, Complete after the handler). Give it to middleware.New in place
// of the Store; build it with Store.OneTx. Safe for concurrent use.
type TxStore struct {
	*Store
	pool        *pgxpool.Pool
	wait        time.Duration // the lock wait
	lockSQL     string        // SET LOCAL lock_timeout to the lock wait
	firstSQL    string        // firstClaimSQL: the insert, and the row in its way only when there is one
	completeSQL string        // completeSQL failing (division by zero) when it matched no row
}

var (
	_ store.Store  = (*TxStore)(nil)
	_ store.Waiter = (*TxStore)(nil)
)

// TxOption configures a TxStore.
type TxOption func(*TxStore) time.Duration

// WithLockWait sets how long a duplicate of a request in flight waits for its
// row lock (default DefaultLockWait; from 1 ms to 24 days, whole milliseconds,
// rounded up). A claim whose context has a deadline (the middleware's claim
// timeout, middleware.StoreFailureRule.Timeouts, 5 s by default) waits at most half of
// the time left to it, so the lock wait ends first and the duplicate is
// answered 409, not 503 (a claim cut short by its deadline counts as a store
// outage, and with middleware.StoreFailureRule.FailOpen would run the handler unprotected).
func WithLockWait(d time.Duration) TxOption { return func(*TxStore) time.Duration { return d } }

// OneTx returns the one-transaction mode of s on pool, the pool of s's database
// (usually the Querier s was built with). Errors wrap store.ErrInvalid: a nil
// pool, or a lock wait outside 1 ms to 24 days.
func (s *Store) OneTx(pool *pgxpool.Pool, opts ...TxOption) (*TxStore, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: postgres: nil pool for the one-transaction mode", store.ErrInvalid)
	}
	if s.epoch > 0 {
		return nil, errPartitionedOneTx // partition.go
	}
	wait := DefaultLockWait
	t := &TxStore{Store: s, pool: pool}
	for _, o := range opts {
		wait = o(t)
	}
	ms := codec.Millis(wait)
	if wait <= 0 || ms > math.MaxInt32 {
		return nil, fmt.Errorf("%w: postgres: lock wait %v outside 1 ms to 24 days", store.ErrInvalid, wait)
	}
	t.wait, t.lockSQL = wait, lockTimeoutSQL(ms)
	t.completeSQL = "WITH done AS (" + s.completeSQL + ") SELECT 1 / count(*) FROM done"
	t.firstSQL = fmt.Sprintf(firstClaimSQL, s.qualified)
	return t, nil
}

func lockTimeoutSQL(ms int64) string { return "SET LOCAL lock_timeout = " + strconv.FormatInt(ms, 10) }

// lockFor returns the statement setting the lock wait of a claim on ctx: the
// lock wait, or half the time left before ctx's deadline when that is shorter
// (at least 1 ms: 0 would mean no bound).
func (t *TxStore) lockFor(ctx context.Context) string {
	dl, ok := ctx.Deadline()
	if !ok {
		return t.lockSQL
	}
	if half := time.Until(dl) / 2; half < t.wait {
		return lockTimeoutSQL(max(1, half.Milliseconds()))
	}
	return t.lockSQL
}

// txKey is the context key of the request's *txSlot (set by Route).
type txKey struct{}

// txSlot is the transaction of one request on a Route: empty until the claim,
// then open (conn set) until Complete, Release or the end of the request.
type txSlot struct {
	use    sync.Mutex // held by a call of the handler's Tx (claimTx.use), taken before mu
	mu     sync.Mutex
	conn   *pgxpool.Conn // the open transaction's connection; nil when none
	real   pgx.Tx        // the open transaction
	token  store.Token   // the claim the transaction holds
	tx     *claimTx      // the handler's view of it
	failed bool          // a claimed transaction ended without its commit
	ending chan struct{} // closed once the transaction taken from the slot has ended
}

func slotOf(ctx context.Context) *txSlot {
	s, _ := ctx.Value(txKey{}).(*txSlot)
	return s
}

// holds reports whether s has an open transaction for token.
func (s *txSlot) holds(token store.Token) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn != nil && s.token == token
}

// open records the claim's transaction.
func (s *txSlot) open(c openTx, token store.Token) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conn, s.real, s.token, s.failed = c.conn, c.tx, token, false
	s.tx = &claimTx{Tx: c.tx, slot: s}
}

// openTx is a transaction and its pooled connection; ended, when not nil, is
// closed once it has ended.
type openTx struct {
	conn  *pgxpool.Conn
	tx    pgx.Tx
	ended chan struct{}
}

// end rolls the transaction back, if still open, and gives the connection back
// to the pool (which closes it when the rollback failed).
func (c openTx) end() {
	if c.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
	_ = c.tx.Rollback(ctx)
	cancel()
	c.release()
}

// release gives the connection of an ended transaction back to the pool.
func (c openTx) release() {
	c.conn.Release()
	if c.ended != nil {
		close(c.ended)
	}
}

// take returns the open transaction's connection and closes the slot (the
// handler's Tx refuses further use); failed records whether the caller ends it
// without a commit that answers the request.
func (s *txSlot) take(failed bool) openTx {
	if s.lockUse() { // a statement of the handler's under way ends first
		defer s.use.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := openTx{conn: s.conn, tx: s.real}
	s.conn, s.real, s.tx = nil, nil, nil
	if c.conn != nil {
		s.failed = failed
		s.ending = make(chan struct{})
		c.ended = s.ending
	}
	return c
}

// useWait bounds how long take waits for a call of the handler's Tx: a QueryRow
// the handler never scans holds it for ever; take then goes on without it, and
// the commit or rollback fails on the busy connection, which the pool closes.
var useWait = endTimeout

// lockUse takes s.use, waiting at most useWait, and tells whether it did.
func (s *txSlot) lockUse() bool {
	if s.use.TryLock() {
		return true
	}
	got, abandon := make(chan struct{}), make(chan struct{})
	go func() {
		s.use.Lock()
		select {
		case got <- struct{}{}: // take holds it
		case <-abandon:
			s.use.Unlock()
		}
	}()
	timer := time.NewTimer(useWait)
	defer timer.Stop()
	select {
	case <-got:
		return true
	case <-timer.C:
		close(abandon)
		return false
	}
}

// wait returns once a transaction taken from the slot has ended (a Complete or
// Release still running when the middleware returned).
func (s *txSlot) wait() {
	s.mu.Lock()
	ch := s.ending
	s.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// fail records that the claimed transaction ended without its commit.
func (s *txSlot) fail() {
	s.mu.Lock()
	s.failed = true
	s.mu.Unlock()
}

func (s *txSlot) hasFailed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// TxFromContext returns the transaction the handler of a one-transaction route
// (Route) runs in, under the claim of ctx (claim.FromContext): its statements commit together with the idempotency record,
// or not at all. ok is false outside such a route, and when the handler runs
// without a claim (a method the middleware does not protect, no key where keys
// are optional, middleware.StoreFailureRule.FailOpen during a store outage): it then works
// in a transaction of its own, or answers 5xx.
//
// The transaction is the middleware's: its Commit and Rollback return
// ErrTxOwned (answer 5xx to roll it back), and it must not be used after the
// handler returns (then its statements return pgx.ErrTxClosed). Begin opens a
// savepoint, as on any pgx.Tx, and the savepoint too returns pgx.ErrTxClosed
// once the handler has returned. A statement that passed the check runs in the
// transaction: the completion waits for it (for a QueryRow, until its Scan);
// close the Rows of Query and the results of SendBatch before the handler
// returns (pgx's rule too), or the completion fails and the client gets 503.
// Conn and LargeObjects bypass these checks: use neither after the handler
// returns. Leave the store's table alone in it.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	s := slotOf(ctx)
	cl, ok := claim.FromContext(ctx) // the claim the handler runs under, set by the middleware
	if s == nil || !ok {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tx == nil || s.token != cl.Token {
		return nil, false
	}
	return s.tx, true
}

// Claim implements store.Store. Outside a Route it is Store.Claim. On a Route it
// begins a transaction and claims in it in one round trip (BEGIN, SET LOCAL
// lock_timeout, the claim statement of Store.Claim, RESET of the lock timeout);
// a claim keeps the transaction open for the handler; any other answer (replay,
// mismatch, the lock wait over: InFlight with RetryAfter the lease) ends it at
// once. A serialization failure or deadlock, or a key committed after the
// statement's snapshot, runs the claim again in a new transaction (at most 5
// times in all). The first attempt is a plain INSERT ... ON CONFLICT DO
// NOTHING that reads the row in its way only when there is one (firstClaimSQL),
// so a new key costs one insert, and a duplicate that waited for the holder's
// commit locks nothing and looks again (a replay, read without a lock); the
// later attempts run the store's claim statement as is, which also takes over
// an expired record. Errors: store.ErrInvalid for bad arguments, otherwise the
// driver's errors wrapped.
func (t *TxStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	slot := slotOf(ctx)
	if slot == nil {
		return t.Store.Claim(ctx, req)
	}
	tries := 0
	return t.claimLoop(req, "claim in transaction", func(tok store.Token, args []any) (store.ClaimResult, bool, error) {
		sql := t.firstSQL
		if tries++; tries > 1 {
			sql = t.claimSQL
		}
		res, c, again, err := t.claimOnce(ctx, sql, req, tok, args)
		if c.conn != nil {
			slot.open(c, tok)
		}
		return res, again, err
	})
}

// claimOnce runs one claim transaction. It returns the connection of an open
// transaction when it claimed, and again when the claim must run once more.
func (t *TxStore) claimOnce(ctx context.Context, sql string, req store.ClaimRequest, tok store.Token, args []any) (
	_ store.ClaimResult, _ openTx, again bool, _ error) {
	conn, err := t.pool.Acquire(ctx)
	if err != nil {
		return store.ClaimResult{}, openTx{}, false, fmt.Errorf("idemkey/postgres: claim in transaction: %w", err)
	}
	var r claimRow
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	b.Queue(t.lockFor(ctx))
	b.Queue(sql, args...).QueryRow(r.scan)
	b.Queue("SET LOCAL lock_timeout TO DEFAULT")
	br := conn.SendBatch(ctx, b)
	c := openTx{conn: conn, tx: br.Tx()}
	err = br.Close()
	if err == nil && r.claimed {
		return store.ClaimResult{Outcome: store.Claimed, Token: tok, Takeover: r.takeover}, c, false, nil
	}
	// Nothing to run: end the transaction without making the caller wait for it
	// (reads lock nothing, nor does the first attempt's insert on a conflict; a
	// later attempt's DO UPDATE that met a row it may not take keeps that row
	// locked until this ROLLBACK).
	go c.end()
	var pg *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err == nil && r.stale:
		return store.ClaimResult{}, openTx{}, true, nil // committed after our snapshot: look again
	case errors.As(err, &pg) && pg.Code == "55P03": // lock_not_available: the holder runs on
		return store.ClaimResult{Outcome: store.InFlight, RetryAfter: req.Lease}, openTx{}, false, nil
	case errors.As(err, &pg) && (pg.Code == "40001" || pg.Code == "40P01"):
		return store.ClaimResult{}, openTx{}, true, nil // serialization failure, deadlock: a new transaction
	case err != nil:
		return store.ClaimResult{}, openTx{}, false, fmt.Errorf("idemkey/postgres: claim in transaction: %w", err)
	}
	res, err := t.decide(&r, req, tok)
	return res, openTx{}, false, err
}

// Complete implements store.Store. On a Route it completes the record in the
// request's transaction and commits, in one round trip, fenced: a completion
// that matches no row fails, so the commit does not run. Every failure ends the
// transaction and wraps store.ErrLeaseLost (the transaction that held the claim
// is gone: retrying cannot help; Route answers the client 503), and also
// ErrCommitUnknown when the commit's outcome is not known (see ErrCommitUnknown:
// a retry then replays or runs). Elsewhere it is Store.Complete.
func (t *TxStore) Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	slot := slotOf(ctx)
	if !slot.holds(token) {
		return t.Store.Complete(ctx, id, token, resp, retention)
	}
	if err := t.checkComplete(id, token, resp, retention); err != nil {
		slot.take(true).end()
		return fmt.Errorf("%w (%w)", err, store.ErrLeaseLost)
	}
	c := slot.take(false)
	b := &pgx.Batch{}
	b.Queue(t.completeSQL, t.completeArgs(id, token, resp, retention)...)
	b.Queue("COMMIT")
	// Sent on the connection: pgx's Tx does not learn of the COMMIT, and is
	// dropped (its Rollback would cost a round trip for nothing).
	err := c.conn.SendBatch(ctx, b).Close()
	if err == nil {
		c.release()
		return nil
	}
	slot.fail()
	c.end()
	var pg *pgconn.PgError
	if errors.As(err, &pg) { // the server refused: nothing committed
		return fmt.Errorf("idemkey/postgres: complete in transaction: rolled back (%w): %w", store.ErrLeaseLost, err)
	}
	return fmt.Errorf("idemkey/postgres: complete in transaction: %w (%w): %w", ErrCommitUnknown, store.ErrLeaseLost, err)
}

// Release implements store.Store. On a Route it rolls the request's transaction
// back (the handler's rows and the claim are gone; the key is free) and returns
// nil. Elsewhere it is Store.Release.
func (t *TxStore) Release(ctx context.Context, id store.ID, token store.Token) error {
	slot := slotOf(ctx)
	if !slot.holds(token) {
		return t.Store.Release(ctx, id, token)
	}
	slot.take(false).end()
	return nil
}

// Renew implements store.Store: on a Route the transaction holds the key, so
// there is nothing to renew (nil, no I/O); elsewhere Store.Renew.
func (t *TxStore) Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error {
	if slotOf(ctx).holds(token) {
		return nil
	}
	return t.Store.Renew(ctx, id, token, lease)
}

// Wait implements store.Waiter. On a Route it returns nil at once: the next claim
// waits on the holder's row lock itself (up to the lock wait). Elsewhere it is
// Store.Wait.
func (t *TxStore) Wait(ctx context.Context, id store.ID) error {
	if slotOf(ctx) != nil {
		return id.Validate()
	}
	return t.Store.Wait(ctx, id)
}
