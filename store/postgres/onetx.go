package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
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

// The claim's statements (docs/architecture.md section 9.1). tryLockSQL takes the
// key's lock ($1, keyLock) until the transaction ends if no other transaction
// holds it, without waiting, and marks the transaction as the claim's ($2, the
// token: a transaction-local setting, gone when the transaction ends, however it
// ends). The read of the key's row follows in the same batch (each statement
// reads with a snapshot of its own, so it sees whatever the lock's previous
// holder committed); only a claim that found the lock held waits for it
// (keyLockSQL: lock_timeout set to the lock wait $1, the lock $2 taken, and
// lock_timeout set back, in one statement of constant text), one round trip more.
const (
	tryLockSQL = `SELECT pg_try_advisory_xact_lock($1) FROM set_config('idemkey.claim', encode($2, 'hex'), true)`
	keyLockSQL = `WITH prev AS MATERIALIZED (SELECT current_setting('lock_timeout') AS v),
     bound AS MATERIALIZED (SELECT v, set_config('lock_timeout', $1, true) FROM prev),
     held AS MATERIALIZED (SELECT v, pg_advisory_xact_lock($2) FROM bound)
SELECT set_config('lock_timeout', v, true) FROM held`

	// recordSQL inserts the record of a claim that found no row (%[1]s the
	// table; completeSQL's arguments, $9 the fingerprint); fenceSQL wraps it, or
	// the completion of a row taken over, with the fence the server checks: this
	// transaction is still the claim's ($3, the token, set by tryLockSQL) and holds
	// the key's lock ($%[2]d). Without it the statement fails (division by zero),
	// the transaction is aborted and the COMMIT behind it does not run.
	recordSQL = `INSERT INTO %[1]s (scope, key, fingerprint, token, status, headers, body, body_omitted,
    created_at, completed_at, expires_at)
VALUES ($1, $2, $9, $3, $4, $5, $6, $7, now(), now(), now() + $8::bigint * interval '1 millisecond') RETURNING 1`
	fenceSQL = `WITH done AS (%[1]s) SELECT 1 / count(*) FROM done
WHERE current_setting('idemkey.claim', true) = encode($3, 'hex') AND pg_try_advisory_xact_lock($%[2]d)`
)

// TxStore is the store's one-transaction mode (docs/architecture.md section 9.1):
// it holds a claim in a transaction (claim.TxStore), in which the handler's
// statements run (TxFromContext) and the record commits with them, once. The
// claim takes the key's advisory lock (keyLock); the completion inserts the
// record; a duplicate blocks on the lock at most the lock wait (WithLockWait)
// and then finds the committed record (replay) or is answered in flight (409).
// The transaction is the lease and the fence: nothing is renewed, a crash aborts
// it and frees the key. Routes select the mode explicitly
// (middleware.Middleware.OneTx, idem.Runner.DoTx); everywhere else TxStore is
// the Store it embeds. Build it with Store.OneTx. Safe for concurrent use.
type TxStore struct {
	*Store
	pool        *pgxpool.Pool
	wait        time.Duration // the lock wait
	lockWait    string        // the lock wait in milliseconds, keyLockSQL's $1
	stmtTimeout time.Duration // bound of each statement of the handler's (WithStatementTimeout)
	recordSQL   string        // the fenced insert of a claim that found no row
	completeSQL string        // the fenced completion of a row taken over
}

var _ claim.TxStore = (*TxStore)(nil)

// TxOption configures a TxStore.
type TxOption func(*TxStore)

// WithLockWait sets how long a duplicate of a request in flight waits for its
// key's lock (default DefaultLockWait; from 1 ms to 24 days, whole milliseconds,
// rounded up). A claim whose context has a deadline (the claim timeout, 5 s by
// default) waits at most half of the time left to it, so the lock wait ends
// first and the duplicate is answered 409, not 503.
func WithLockWait(d time.Duration) TxOption { return func(t *TxStore) { t.wait = d } }

// WithStatementTimeout bounds each statement the handler runs in its
// transaction (default claim.DefaultStoreTimeout, 5 s): a context deadline on
// the connection, so a hung server fails the statement within it (the
// connection is then closed, the transaction lost, the key freed) and the
// client has its answer within the handler's time plus one bound. A statement
// whose own context ends first ends then.
func WithStatementTimeout(d time.Duration) TxOption { return func(t *TxStore) { t.stmtTimeout = d } }

// OneTx returns the one-transaction mode of s on pool, the pool of s's database
// (usually the Querier s was built with). Errors wrap store.ErrInvalid: a nil
// pool, a lock wait outside 1 ms to 24 days, a statement timeout not positive.
//
// The handler's statements and the claim's run on pool's connections in pool's
// own query exec mode, not in the mode WithTransactionPooler forces on s's own
// statements: behind a transaction pooler such as PgBouncer, configure pool for
// it as the handler's own queries need.
func (s *Store) OneTx(pool *pgxpool.Pool, opts ...TxOption) (*TxStore, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: postgres: nil pool for the one-transaction mode", store.ErrInvalid)
	}
	if s.part != nil {
		return nil, errPartitionedOneTx // partition.go
	}
	t := &TxStore{Store: s, pool: pool, wait: DefaultLockWait, stmtTimeout: claim.DefaultStoreTimeout}
	for _, o := range opts {
		o(t)
	}
	ms := codec.Millis(t.wait)
	if t.wait <= 0 || ms > math.MaxInt32 || t.stmtTimeout <= 0 {
		return nil, fmt.Errorf("%w: postgres: lock wait %v outside 1 ms to 24 days, or statement timeout %v not positive", store.ErrInvalid, t.wait, t.stmtTimeout)
	}
	t.lockWait = strconv.FormatInt(ms, 10)
	t.completeSQL = fmt.Sprintf(fenceSQL, s.completeSQL, 9)
	t.recordSQL = fmt.Sprintf(fenceSQL, fmt.Sprintf(recordSQL, s.qualified), 10)
	return t, nil
}

// lockFor returns the lock wait of a claim on ctx, in milliseconds as text:
// the lock wait, or half the time left before ctx's deadline when shorter (at
// least 1 ms: 0 would mean no bound).
func (t *TxStore) lockFor(ctx context.Context) string {
	if dl, ok := ctx.Deadline(); ok {
		if half := time.Until(dl) / 2; half < t.wait {
			return strconv.FormatInt(max(1, half.Milliseconds()), 10)
		}
	}
	return t.lockWait
}

// ClaimTx implements claim.TxStore. It begins a transaction and claims in it in
// one round trip when no one holds the key (BEGIN, the key's lock tried, the
// read of its record; lockAndRead), two when another transaction holds it
// (then the wait for the lock, at most the lock wait, and the read again). A
// key without a record claims without writing (the commit inserts the record);
// an expired record, or one whose lease lapsed, is taken over by the store's
// claim statement in the same transaction, one round trip more. Any answer but
// Claimed ends the transaction at once (a lock wait over: InFlight with
// RetryAfter the lease). A serialization failure or deadlock, or a takeover
// that met a newer row, claims again in a new transaction (at most 5 times in
// all). Errors: store.ErrInvalid for bad arguments, otherwise the driver's
// errors wrapped.
func (t *TxStore) ClaimTx(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, claim.Tx, error) {
	var tx claim.Tx
	res, err := t.claimLoop(req, "claim in transaction", func(tok store.Token, args []any) (store.ClaimResult, bool, error) {
		res, c, again, err := t.claimOnce(ctx, req, tok, args)
		if c != nil {
			tx = c
		}
		return res, again, err
	})
	return res, tx, err
}

// claimOnce runs one claim transaction: the open transaction when it claimed,
// again when the claim must run once more.
func (t *TxStore) claimOnce(ctx context.Context, req store.ClaimRequest, tok store.Token, args []any) (
	_ store.ClaimResult, _ *txClaim, again bool, _ error) {
	conn, err := t.pool.Acquire(ctx)
	if err != nil {
		return store.ClaimResult{}, nil, false, fmt.Errorf("idemkey/postgres: claim in transaction: %w", err)
	}
	c := &txClaim{t: t, conn: conn, id: req.ID, token: tok, req: req, lock: t.keyLock(req.ID)}
	found, r, err := c.lockAndRead(ctx, args)
	c.insert = !found
	if err == nil && r.stale { // takeable: take the row over, in this transaction
		r, c.insert = claimRow{}, false
		err = r.scan(c.tx.QueryRow(ctx, t.claimSQL, args...))
	}
	if err == nil && r.claimed && !r.stale {
		c.handler = &claimTx{Tx: c.tx, c: c}
		return store.ClaimResult{Outcome: store.Claimed, Token: tok, Takeover: r.takeover}, c, false, nil
	}
	// Nothing to run: end the transaction without making the caller wait for it.
	go c.end()
	var pg *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err == nil && r.stale:
		return store.ClaimResult{}, nil, true, nil // a takeover that met a newer row: look again
	case errors.As(err, &pg) && pg.Code == "55P03": // lock_not_available: the holder runs on
		return store.ClaimResult{Outcome: store.InFlight, RetryAfter: req.Lease}, nil, false, nil
	case errors.As(err, &pg) && (pg.Code == "40001" || pg.Code == "40P01"):
		return store.ClaimResult{}, nil, true, nil // serialization failure, deadlock: a new transaction
	case err != nil:
		return store.ClaimResult{}, nil, false, fmt.Errorf("idemkey/postgres: claim in transaction: %w", err)
	}
	res, err := t.decide(&r, req, tok)
	return res, nil, false, err
}

// lockAndRead begins the claim's transaction, takes the key's lock in it and
// reads the key's row after the lock: one round trip when the lock is free,
// two when another transaction holds it. The results are read in order,
// without callbacks, which would allocate.
func (c *txClaim) lockAndRead(ctx context.Context, args []any) (found bool, r claimRow, err error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	b.Queue(tryLockSQL, c.lock, args[3])
	b.Queue(c.t.readSQL, args[0], args[1])
	br := c.conn.SendBatch(ctx, b)
	c.tx = br.Tx()
	var k keyRow
	held := false
	if _, err = br.Exec(); err == nil { // BEGIN
		err = br.QueryRow().Scan(&held)
	}
	if err == nil {
		found, err = scanKey(br.QueryRow(), &k)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && !held { // another transaction holds the key: wait for it, then read again
		b = &pgx.Batch{}
		b.Queue(keyLockSQL, c.t.lockFor(ctx), c.lock)
		b.Queue(c.t.readSQL, args[0], args[1])
		br = c.tx.SendBatch(ctx, b)
		if _, err = br.Exec(); err == nil {
			found, err = scanKey(br.QueryRow(), &k)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	if found {
		r = k.judge(c.req.Fingerprint)
	} else {
		r.claimed = true
	}
	return found, r, err
}

// scanKey reads the key's row into k; found false when there is none.
func scanKey(row pgx.Row, k *keyRow) (found bool, err error) {
	err = row.Scan(k.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// keyLock returns the key of id's advisory lock: FNV-1a (64 bits) of the
// table's quoted name, the scope's length (a zero byte, then 8 bytes big
// endian) and the scope and key bytes, so stores on other tables, and the
// application's own advisory locks, meet it only by a hash collision (a
// needless wait, never a wrong answer). Every build must compute the same key
// (TestKeyLockIsFNV1a).
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
