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

// DefaultLockWait is how long a duplicate waits for the key's lock in
// one-transaction mode (WithLockWait) before it is answered in flight (409).
const DefaultLockWait = time.Second

// endTimeout bounds the ROLLBACK that ends a transaction no handler runs in.
const endTimeout = 5 * time.Second

// recordSQL is the completion of a one-transaction claim that found no record
// (%[1]s the quoted table name; the arguments of completeSQL, then $9 the
// fingerprint): the record, written once. now() is the transaction's start,
// the claim's time. It is also the fence: a row committed for the key since the
// claim (only a claim of the ordinary mode can do that, as it does not take the
// key's lock) makes it fail with a unique violation, so the commit does not run.
const recordSQL = `INSERT INTO %[1]s (scope, key, fingerprint, token, status, headers, body, body_omitted,
    created_at, completed_at, expires_at)
VALUES ($1, $2, $9, $3, $4, $5, $6, $7, now(), now(), now() + $8::bigint * interval '1 millisecond')`

// tryLockSQL takes the key's lock ($1, keyLock) until the transaction ends if
// no other transaction holds it, without waiting: true when it did. The claim
// sends it first, with the read of the key's row after it (each statement of
// the batch reads with a snapshot of its own, taken when it starts, so the read
// sees whatever the lock's previous holder committed), and only a claim that
// found the lock held waits for it (keyLockSQL), one round trip more. Trying
// first costs the server a third of keyLockSQL (callgrind, 21k instructions
// against 53k per claim).
const tryLockSQL = `SELECT pg_try_advisory_xact_lock($1)`

// keyLockSQL takes the key's lock ($2, keyLock) until the transaction ends,
// waiting for it at most the lock wait ($1, milliseconds as text), in one
// statement of constant text (prepared once per connection): lock_timeout is
// set to the lock wait, the lock taken, and lock_timeout set back to the
// value it had, so the handler's statements do not run under it. The chain
// of materialized CTEs fixes the order: each step reads the row of the one
// before. Only a claim whose tryLockSQL found the lock held sends it.
const keyLockSQL = `WITH prev AS MATERIALIZED (SELECT current_setting('lock_timeout') AS v),
     bound AS MATERIALIZED (SELECT v, set_config('lock_timeout', $1, true) FROM prev),
     held AS MATERIALIZED (SELECT v, pg_advisory_xact_lock($2) FROM bound)
SELECT set_config('lock_timeout', v, true) FROM held`

// TxStore is the store's one-transaction mode (docs/architecture.md section 9.1):
// on the routes wrapped with Route, the claim, the handler's statements and the
// completion run in one transaction and commit once. The claim takes the key's
// advisory lock (keyLock) and the completion inserts the record with the
// response; a concurrent duplicate blocks on the lock for at most
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
	lockWait    string        // the lock wait in milliseconds, keyLockSQL's $1
	recordSQL   string        // recordSQL: the completion of a claim that found no record
	completeSQL string        // completeSQL failing (division by zero) when it matched no row
}

var (
	_ store.Store  = (*TxStore)(nil)
	_ store.Waiter = (*TxStore)(nil)
)

// TxOption configures a TxStore.
type TxOption func(*TxStore) time.Duration

// WithLockWait sets how long a duplicate of a request in flight waits for its
// key's lock (default DefaultLockWait; from 1 ms to 24 days, whole milliseconds,
// rounded up). A claim whose context has a deadline (the middleware's claim
// timeout, policy.StoreFailureRule.Timeouts, 5 s by default) waits at most half of
// the time left to it, so the lock wait ends first and the duplicate is
// answered 409, not 503 (a claim cut short by its deadline counts as a store
// outage, and with policy.StoreFailureRule.FailOpen would run the handler unprotected).
func WithLockWait(d time.Duration) TxOption { return func(*TxStore) time.Duration { return d } }

// OneTx returns the one-transaction mode of s on pool, the pool of s's database
// (usually the Querier s was built with). Errors wrap store.ErrInvalid: a nil
// pool, or a lock wait outside 1 ms to 24 days.
//
// The route's statements, the claim's batch included, run on pool's connections
// in pool's own query exec mode (pgx.ConnConfig.DefaultQueryExecMode), not in
// the mode WithTransactionPooler forces on s's own statements: behind a
// transaction pooler such as PgBouncer, configure pool for it as the handler's
// own queries need (QueryExecModeExec or QueryExecModeSimpleProtocol).
func (s *Store) OneTx(pool *pgxpool.Pool, opts ...TxOption) (*TxStore, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: postgres: nil pool for the one-transaction mode", store.ErrInvalid)
	}
	if s.part != nil {
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
	t.wait, t.lockWait = wait, strconv.FormatInt(ms, 10)
	t.completeSQL = "WITH done AS (" + s.completeSQL + ") SELECT 1 / count(*) FROM done"
	t.recordSQL = fmt.Sprintf(recordSQL, s.qualified)
	return t, nil
}

// lockFor returns the lock wait of a claim on ctx, in milliseconds as text
// (keyLockSQL's $1): the lock wait, or half the time left before ctx's
// deadline when that is shorter (at least 1 ms: 0 would mean no bound).
func (t *TxStore) lockFor(ctx context.Context) string {
	dl, ok := ctx.Deadline()
	if !ok {
		return t.lockWait
	}
	if half := time.Until(dl) / 2; half < t.wait {
		return strconv.FormatInt(max(1, half.Milliseconds()), 10)
	}
	return t.lockWait
}

// txKey is the context key of the request's *txSlot (set by Route).
type txKey struct{}

// txSlot is the transaction of one request on a Route: empty until the claim,
// then open (conn set) until Complete, Release or the end of the request.
type txSlot struct {
	use    sync.Mutex // held by a call of the handler's Tx (claimTx.use), taken before mu
	mu     sync.Mutex
	conn   *pgxpool.Conn     // the open transaction's connection; nil when none
	real   pgx.Tx            // the open transaction
	token  store.Token       // the claim the transaction holds
	insert bool              // the completion inserts the record (openTx.insert)
	fp     store.Fingerprint // the claimed request's fingerprint, for the insert
	tx     *claimTx          // the handler's view of it
	failed bool              // a claimed transaction ended without its commit
	ending chan struct{}     // closed once the transaction taken from the slot has ended
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

// open records the claim's transaction, of the request with fingerprint fp.
func (s *txSlot) open(c openTx, token store.Token, fp store.Fingerprint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conn, s.real, s.token, s.failed = c.conn, c.tx, token, false
	s.insert, s.fp = c.insert, fp
	s.tx = &claimTx{Tx: c.tx, slot: s}
}

// openTx is a transaction and its pooled connection; ended, when not nil, is
// closed once it has ended.
type openTx struct {
	conn   *pgxpool.Conn
	tx     pgx.Tx
	ended  chan struct{}
	insert bool // the claim found no record: the completion inserts it (recordSQL)
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
	c := openTx{conn: s.conn, tx: s.real, insert: s.insert}
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

func (s *txSlot) fingerprint() store.Fingerprint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fp
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
// are optional, policy.StoreFailureRule.FailOpen during a store outage): it then works
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
// begins a transaction and claims in it in one round trip when no one holds the
// key (BEGIN, the key's lock tried, the read of its record; lockAndRead), two
// when another transaction holds it (then the wait for the lock, at most the
// lock wait, and the read again); a claim keeps the transaction open for the
// handler; any other answer (replay, mismatch, the lock wait over: InFlight
// with RetryAfter the lease) ends it at once. The key's lock (keyLock, a
// transaction-level advisory lock) is what duplicates wait on: a duplicate gets
// it once the holder's transaction has ended and then reads the committed
// record, if any. A key without a record claims without writing (the
// completion inserts the record with the response); an expired record, or one
// whose lease lapsed, is taken over by the store's claim statement in the same
// transaction, one round trip more. A serialization failure or deadlock, or a takeover that met a newer
// row, runs the claim again in a new transaction (at most 5 times in all).
// Errors: store.ErrInvalid for bad arguments, otherwise the driver's errors
// wrapped.
func (t *TxStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	slot := slotOf(ctx)
	if slot == nil {
		return t.Store.Claim(ctx, req)
	}
	return t.claimLoop(req, "claim in transaction", func(tok store.Token, args []any) (store.ClaimResult, bool, error) {
		res, c, again, err := t.claimOnce(ctx, req, tok, args)
		if c.conn != nil {
			slot.open(c, tok, req.Fingerprint)
		}
		return res, again, err
	})
}

// claimOnce runs one claim transaction. It returns the connection of an open
// transaction when it claimed, and again when the claim must run once more.
func (t *TxStore) claimOnce(ctx context.Context, req store.ClaimRequest, tok store.Token, args []any) (
	_ store.ClaimResult, _ openTx, again bool, _ error) {
	conn, err := t.pool.Acquire(ctx)
	if err != nil {
		return store.ClaimResult{}, openTx{}, false, fmt.Errorf("idemkey/postgres: claim in transaction: %w", err)
	}
	c, k, err := t.lockAndRead(ctx, conn, req.ID, args)
	r := claimRow{claimed: !k.found}
	if k.found {
		r = k.row.judge(req.Fingerprint)
	}
	if err == nil && r.stale { // takeable: take the row over, in this transaction
		r, c.insert = claimRow{}, false
		err = r.scan(c.tx.QueryRow(ctx, t.claimSQL, args...))
	}
	if err == nil && r.claimed && !r.stale {
		return store.ClaimResult{Outcome: store.Claimed, Token: tok, Takeover: r.takeover}, c, false, nil
	}
	// Nothing to run: end the transaction without making the caller wait for it
	// (the key's lock, and the row lock of a takeover that met a row it may not
	// take, are held until this ROLLBACK).
	go c.end()
	var pg *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err == nil && r.stale:
		return store.ClaimResult{}, openTx{}, true, nil // a takeover that met a newer row: look again
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

// lockAndRead begins the claim's transaction on conn, takes the key's lock in
// it and reads the key's row after the lock: one round trip when the lock is
// free (BEGIN, tryLockSQL, rowSQL), two when another transaction holds it (then
// keyLockSQL waits, at most the lock wait, and rowSQL reads again). The
// results are read in order, without callbacks, which would allocate.
func (t *TxStore) lockAndRead(ctx context.Context, conn *pgxpool.Conn, id store.ID, args []any) (openTx, keyRead, error) {
	lock := t.keyLock(id)
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	b.Queue(tryLockSQL, lock)
	b.Queue(t.readSQL, args[0], args[1])
	br := conn.SendBatch(ctx, b)
	c := openTx{conn: conn, tx: br.Tx(), insert: true}
	var k keyRead
	_, err := br.Exec() // BEGIN
	if err == nil {
		err = br.QueryRow().Scan(&k.held)
	}
	if err == nil {
		err = k.scan(br.QueryRow())
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && !k.held { // another transaction holds the key: wait for it, then read again
		b = &pgx.Batch{}
		b.Queue(keyLockSQL, t.lockFor(ctx), lock)
		b.Queue(t.readSQL, args[0], args[1])
		br = c.tx.SendBatch(ctx, b)
		k = keyRead{held: true}
		if _, err = br.Exec(); err == nil {
			err = k.scan(br.QueryRow())
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	return c, k, err
}

// keyRead is the key's lock and row in a claim's batch: held when the
// transaction has the lock, found false when there is no row.
type keyRead struct {
	row         keyRow
	held, found bool
}

func (k *keyRead) scan(row pgx.Row) error {
	err := row.Scan(k.row.dest()...)
	k.found = err == nil
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}

// keyLock returns the key of id's advisory lock: FNV-1a (64 bits) of the
// table's quoted name, the scope's length (a zero byte, then 8 bytes big
// endian) and the scope and key bytes, so stores on other tables, and the
// application's own advisory locks, meet it only by a hash collision (a
// needless wait, never a wrong answer). Computed in place, without a
// hash.Hash; every build must compute the same key, or a claim of one build
// would not wait for a holder of another (TestKeyLockIsFNV1a).
func (t *TxStore) keyLock(id store.ID) int64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := range len(t.qualified) {
		h = (h ^ uint64(t.qualified[i])) * prime
	}
	h *= prime // the zero byte
	for shift := 56; shift >= 0; shift -= 8 {
		h = (h ^ uint64(len(id.Scope)>>shift&0xff)) * prime
	}
	for i := range len(id.Scope) {
		h = (h ^ uint64(id.Scope[i])) * prime
	}
	for i := range len(id.Key) {
		h = (h ^ uint64(id.Key[i])) * prime
	}
	return int64(h)
}

// Complete implements store.Store. On a Route it writes the record in the
// request's transaction and commits, in one round trip, fenced: the insert
// (recordSQL) fails when a row for the key exists, and the update of a record
// taken over fails when it matches no row, so the commit does not run. Every failure ends the
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
	fp := slot.fingerprint()
	c := slot.take(false)
	b := &pgx.Batch{}
	if args := t.completeArgs(id, token, resp, retention); c.insert {
		b.Queue(t.recordSQL, append(args, fp[:])...)
	} else {
		b.Queue(t.completeSQL, args...)
	}
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
// waits on the holder's key lock itself (up to the lock wait). Elsewhere it is
// Store.Wait.
func (t *TxStore) Wait(ctx context.Context, id store.ID) error {
	if slotOf(ctx) != nil {
		return id.Validate()
	}
	return t.Store.Wait(ctx, id)
}
