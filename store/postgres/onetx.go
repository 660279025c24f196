package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
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

// The claim's statements (docs/architecture.md section 9.1). tryLockSQL tries
// the key's lock ($1) and marks the transaction as the claim's ($2, the token:
// a transaction-local setting); keyLockSQL waits for the lock ($2) at most $1
// milliseconds, lock_timeout set back after. recordSQL inserts the record
// (completeSQL's arguments, $9 the fingerprint); its RETURNING fails (division
// by zero) unless the transaction still carries the mark ($3) and the lock
// ($10), and the COMMIT behind it does not run; fenceSQL puts a takeover's
// completion to the same test, and fails when it matched no row.
const (
	tryLockSQL = `SELECT pg_try_advisory_xact_lock($1), set_config('idemkey.claim', encode($2, 'hex'), true)`
	keyLockSQL = `WITH prev AS MATERIALIZED (SELECT current_setting('lock_timeout') AS v),
     bound AS MATERIALIZED (SELECT v, set_config('lock_timeout', $1::bigint::text, true) FROM prev),
     held AS MATERIALIZED (SELECT v, pg_advisory_xact_lock($2) FROM bound)
SELECT set_config('lock_timeout', v, true) FROM held`
	recordSQL = `INSERT INTO %[1]s (scope, key, fingerprint, token, status, headers, body, body_omitted,
    created_at, completed_at, expires_at)
VALUES ($1, $2, $9, $3, $4, $5, $6, $7, now(), now(), now() + $8::bigint * interval '1 millisecond')`
	fenced   = `current_setting('idemkey.claim', true) = encode($3, 'hex') AND pg_try_advisory_xact_lock($%[2]d)`
	fenceSQL = `WITH done AS (%[1]s) SELECT 1 / count(*) FROM done WHERE ` + fenced
)

// TxStore is the store's one-transaction mode (claim.TxStore, docs/architecture.md
// section 9.1): the claim takes the key's advisory lock in a transaction, the
// handler's statements run in it (TxFromContext) and the record commits with
// them, once; a duplicate waits on the lock at most WithLockWait, then replays
// or gets 409. Routes select the mode (middleware.Middleware.OneTx,
// idem.Runner.DoTx); elsewhere TxStore is the Store it embeds. Build it with
// Store.OneTx. Safe for concurrent use.
type TxStore struct {
	*Store
	pool        *pgxpool.Pool
	wait        time.Duration // the lock wait
	stmtTimeout time.Duration // bound of each statement of the handler's (WithStatementTimeout)
	// The fenced insert of a claim that found no row, the fenced completion of a
	// row taken over, the unfenced insert of a record committed on its own.
	recordSQL, completeSQL, aloneSQL string
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
// transaction (default claim.DefaultStoreTimeout, 5 s): a context deadline, so
// a hung server fails the statement within it (the connection is then closed,
// the transaction lost, the key freed) and the client has its answer within
// the handler's time plus one bound.
func WithStatementTimeout(d time.Duration) TxOption { return func(t *TxStore) { t.stmtTimeout = d } }

// OneTx returns the one-transaction mode of s on pool, the pool of s's database.
// Errors wrap store.ErrInvalid: a nil pool, a lock wait outside 1 ms to 24 days,
// a statement timeout not positive. Its statements run in pool's own query exec
// mode: behind a transaction pooler, configure pool as the handler's queries need.
func (s *Store) OneTx(pool *pgxpool.Pool, opts ...TxOption) (*TxStore, error) {
	if pool == nil {
		return nil, fmt.Errorf("idemkey/store/postgres: %w: nil pool for the one-transaction mode", store.ErrInvalid)
	}
	if s.part != nil {
		return nil, errPartitionedOneTx // partition.go
	}
	t := &TxStore{Store: s, pool: pool, wait: DefaultLockWait, stmtTimeout: claim.DefaultStoreTimeout}
	for _, o := range opts {
		o(t)
	}
	if t.wait <= 0 || codec.Millis(t.wait) > math.MaxInt32 || t.stmtTimeout <= 0 {
		return nil, fmt.Errorf("idemkey/store/postgres: %w: lock wait %v outside 1 ms to 24 days, or statement timeout %v not positive", store.ErrInvalid, t.wait, t.stmtTimeout)
	}
	t.aloneSQL = fmt.Sprintf(recordSQL, s.qualified)
	t.recordSQL = t.aloneSQL + fmt.Sprintf(" RETURNING 1 / CASE WHEN "+fenced+" THEN 1 ELSE 0 END", nil, 10)
	t.completeSQL = fmt.Sprintf(fenceSQL, s.completeSQL, 9)
	return t, nil
}

// lockFor returns the lock wait of a claim on ctx in milliseconds: at most
// half the time left before ctx's deadline, so the wait ends first (at least
// 1: 0 would mean no bound).
func (t *TxStore) lockFor(ctx context.Context) int64 {
	d := t.wait
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)/2)
	}
	return max(1, codec.Millis(d))
}

// ClaimTx implements claim.TxStore: one round trip when no one holds the key
// or its record is completed, two when another transaction holds it; a
// takeover of an expired record one more (claimSQL in the transaction). With
// WithReadFirst a completed live record or a live lease of the default mode is
// answered by a read outside any transaction (claimLoop), anything else pays
// it as one round trip more. Any answer but Claimed ends the transaction (a
// lock wait over: InFlight, RetryAfter the lease). A serialization failure, a
// deadlock or a takeover that met a newer row claims again (at most 5 times).
// Errors: store.ErrInvalid for bad arguments, else the driver's, wrapped.
func (t *TxStore) ClaimTx(ctx context.Context, req store.ClaimRequest) (res store.ClaimResult, tx claim.Tx, err error) {
	res, err = t.claimLoop(ctx, req, "claim in transaction", func(tok store.Token, args []any) (r store.ClaimResult, again bool, err error) {
		r, tx, again, err = t.claimOnce(ctx, req, tok, args)
		return r, again, err
	})
	return res, tx, err
}

// claimOnce runs one claim transaction: tx open when it claimed, again when
// the claim must run once more.
func (t *TxStore) claimOnce(ctx context.Context, req store.ClaimRequest, tok store.Token, args []any) (
	_ store.ClaimResult, tx claim.Tx, again bool, _ error) {
	conn, err := t.pool.Acquire(ctx)
	if err != nil {
		return store.ClaimResult{}, nil, false, fmt.Errorf("idemkey/store/postgres: claim in transaction: %w", err)
	}
	req.Token = tok
	c := &txClaim{t: t, conn: conn, req: req, lock: t.keyLock(req.ID), use: make(chan struct{}, 1)}
	r, err := c.lockAndRead(ctx, args)
	c.insert = r.claimed
	if err == nil && r.stale { // takeable: take the row over, in this transaction
		r = claimRow{}
		err = r.scan(c.tx.QueryRow(ctx, t.claimSQL, args...))
	}
	if err == nil && r.claimed && !r.stale {
		c.handler = &claimTx{Tx: c.tx, c: c}
		return store.ClaimResult{Outcome: store.Claimed, Token: tok, Takeover: r.takeover}, c, false, nil
	}
	go c.end() // nothing to run: the caller does not wait for the ROLLBACK
	var pg *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err == nil && r.stale, // a takeover that met a newer row
		errors.As(err, &pg) && (pg.Code == "40001" || pg.Code == "40P01"): // serialization failure, deadlock
		return store.ClaimResult{}, nil, true, nil
	case errors.As(err, &pg) && pg.Code == "55P03": // lock_not_available: the holder runs on
		return store.ClaimResult{Outcome: store.InFlight, RetryAfter: req.Lease}, nil, false, nil
	case err != nil:
		return store.ClaimResult{}, nil, false, fmt.Errorf("idemkey/store/postgres: claim in transaction: %w", err)
	}
	res, err := t.decide(&r, req, tok)
	return res, nil, false, err
}

// lockAndRead begins the claim's transaction, tries the key's lock and reads
// the key's row after it (a statement of its own: its snapshot sees what the
// lock's last holder committed). When another transaction holds the lock it
// waits for it and reads again, unless the row is a completed live record,
// which no holder changes (replays of a hot key do not queue on the lock).
func (c *txClaim) lockAndRead(ctx context.Context, args []any) (r claimRow, err error) {
	held := false
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	b.Queue(tryLockSQL, c.lock, args[3]).QueryRow(func(row pgx.Row) error { return row.Scan(&held, nil) })
	r, err = c.read(b, args, func(b *pgx.Batch) pgx.BatchResults {
		br := c.conn.SendBatch(ctx, b)
		c.tx = br.Tx()
		return br
	})
	if err == nil && !held && !(r.status.Valid && !r.stale) {
		b = &pgx.Batch{}
		b.Queue(keyLockSQL, c.t.lockFor(ctx), c.lock)
		r, err = c.read(b, args, func(b *pgx.Batch) pgx.BatchResults { return c.tx.SendBatch(ctx, b) })
	}
	return r, err
}

// read sends b and the read of the key's row; r.claimed when there is none.
func (c *txClaim) read(b *pgx.Batch, args []any, send func(*pgx.Batch) pgx.BatchResults) (r claimRow, err error) {
	var k keyRow
	found := false
	b.Queue(c.t.readSQL, args[0], args[1]).QueryRow(func(row pgx.Row) error {
		err := row.Scan(k.dest()...)
		if found = err == nil; errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if err = send(b).Close(); found {
		r = k.judge(c.req.Fingerprint)
	}
	r.claimed = !found
	return r, err
}

// keyLock returns id's advisory lock key: FNV-1a (64 bits) of the table's quoted
// name, a zero byte, the scope's length (8 bytes big endian), the scope and the
// key; others meet it only by a collision (a needless wait). Every build must
// compute the same (TestKeyLockIsFNV1a).
func (t *TxStore) keyLock(id store.ID) int64 {
	var n [9]byte // the zero byte, then the scope's length
	binary.BigEndian.PutUint64(n[1:], uint64(len(id.Scope)))
	h := fnv.New64a() // stays on the stack: no allocation
	h.Write([]byte(t.qualified))
	h.Write(n[:])
	h.Write([]byte(id.Scope))
	h.Write([]byte(id.Key))
	return int64(h.Sum64())
}
