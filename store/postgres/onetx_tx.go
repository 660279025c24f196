package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
)

// ErrTxOwned is returned by Commit and Rollback of the handler's transaction
// (TxFromContext), and by a statement that would end it (COMMIT, ROLLBACK, END,
// ABORT, PREPARE TRANSACTION, with or without AND CHAIN): the library commits
// it with the record once the handler returned, or rolls it back when the
// handler's answer releases the key. The statement is not sent.
var ErrTxOwned = errors.New("idemkey/store/postgres: the idempotency library commits or rolls back this transaction")

// errConnBusy: a call of the handler's still held the connection (take).
var errConnBusy = errors.New("idemkey/store/postgres: complete in transaction: a statement of the handler's still held the connection; the transaction was abandoned (nothing committed) and its connection closed")

// errRowOpen: a call of the handler's while its QueryRow is not yet scanned.
var errRowOpen = errors.New("idemkey/store/postgres: conn busy: a QueryRow of this transaction is not yet scanned")

// txClaim is a claim held by an open transaction (claim.Tx).
type txClaim struct {
	t       *TxStore
	conn    *pgxpool.Conn
	tx      pgx.Tx
	req     store.ClaimRequest // its Token the claim's
	lock    int64
	insert  bool     // the claim found no row: the commit inserts the record
	handler *claimTx // the handler's view of the transaction

	use      chan struct{} // holds one token while a call of the handler's runs (claimTx.hold)
	open     atomic.Int32  // the handler's Rows and batches not yet closed
	row      atomic.Bool   // a QueryRow of the handler's holds use until its Scan
	closed   atomic.Bool   // the library took the transaction back: the handler's calls are refused
	sideDoor atomic.Bool   // the handler took the connection (Conn, LargeObjects): what it did is unknown
}

// TxFromContext returns the transaction the handler runs in, in the
// one-transaction mode (middleware.Middleware.OneTx, idem.Runner.DoTx) on a
// TxStore: its statements commit with the record, or not at all. ok is false in
// the default mode, without a claim, and once the handler has returned. Each
// statement is bounded by WithStatementTimeout; savepoints (Begin) are the
// handler's. Commit, Rollback and SQL that would end the transaction return
// ErrTxOwned (not sent); use after returning, pgx.ErrTxClosed. A call left
// holding the connection past the handler's return makes the commit fail (503),
// Conn and LargeObjects are side doors the commit's fence decides on
// (docs/architecture.md section 9.1 lists what a handler may and may not do).
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := claim.TxFromContext(ctx)
	for ok {
		if c, mine := tx.(*txClaim); mine {
			return c.handler, true
		}
		var w interface{ Unwrap() claim.Tx } // a store in front of this one (store/tiered)
		if w, ok = tx.(interface{ Unwrap() claim.Tx }); ok {
			tx = w.Unwrap()
		}
	}
	return nil, false
}

// take closes the transaction to the handler once its call under way ended
// and reports whether it used a side door. ok is false when a call still held
// the connection after useWait or a result is open: then the socket is closed
// under it (the server rolls back, the key is free) and the connection
// dropped from the pool, nothing else of it touched.
func (c *txClaim) take() (sideDoor, ok bool) {
	timer := time.NewTimer(useWait)
	defer timer.Stop()
	select {
	case c.use <- struct{}{}:
		defer func() { <-c.use }()
		ok = c.open.Load() == 0
	case <-timer.C:
	}
	c.closed.Store(true)
	if !ok {
		_ = c.conn.Conn().PgConn().Conn().Close()
		c.conn.Hijack()
	}
	return c.sideDoor.Load(), ok
}

// useWait bounds how long take waits for a call of the handler's.
var useWait = endTimeout

// end rolls the transaction back, if open, and gives the connection back.
func (c *txClaim) end() {
	if c.conn.Conn().PgConn().TxStatus() != 'I' {
		ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
		_, _ = c.conn.Exec(ctx, "ROLLBACK")
		cancel()
	}
	c.conn.Release()
}

// Rollback implements claim.Tx.
func (c *txClaim) Rollback(context.Context) error {
	if _, ok := c.take(); ok {
		c.end()
	}
	return nil
}

// Commit implements claim.Tx: the fenced record and the COMMIT in one round
// trip. An aborted transaction has its record committed on its own
// (recordAlone), one the handler ended or left fails closed (failClosed). A
// commit that fails is rolled back: an error wrapping store.ErrLeaseLost when
// the server refused it, ErrCommitUnknown too when its outcome is unknown.
func (c *txClaim) Commit(ctx context.Context, resp store.Response, retention time.Duration) (claim.TxEnd, error) {
	sideDoor, ok := c.take()
	if !ok {
		return 0, errConnBusy
	}
	id, tok := c.req.ID, c.req.Token
	if err := c.t.checkComplete(id, tok, resp, retention); err != nil {
		c.end()
		return 0, fmt.Errorf("%w (%w)", err, store.ErrLeaseLost)
	}
	args := c.t.completeArgs(id, tok, resp, retention)
	switch st := c.conn.Conn().PgConn().TxStatus(); {
	case st == 'E' && !sideDoor:
		return c.recordAlone(ctx, args)
	case st != 'T':
		return 0, c.failClosed(ctx, fmt.Errorf("transaction status %q after the handler", st))
	}
	b := &pgx.Batch{}
	if c.insert {
		b.Queue(c.t.recordSQL, append(args, c.req.Fingerprint[:], c.lock)...)
	} else {
		b.Queue(c.t.completeSQL, append(args, c.lock)...)
	}
	b.Queue("COMMIT") // on the connection: pgx's Tx does not learn of it, and is dropped
	err := c.conn.SendBatch(ctx, b).Close()
	if err == nil {
		c.conn.Release()
		return claim.TxCommitted, nil
	}
	// pg after the success path: errors.As puts it on the heap.
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "22012" { // the fence: not the claim's transaction
		return 0, c.failClosed(ctx, err)
	}
	c.end()
	if errors.As(err, &pg) { // the server refused: nothing committed
		return 0, fmt.Errorf("idemkey/store/postgres: complete in transaction: rolled back (%w): %w", store.ErrLeaseLost, err)
	}
	return 0, fmt.Errorf("idemkey/store/postgres: complete in transaction: %w (%w): %w", ErrCommitUnknown, store.ErrLeaseLost, err)
}

// recordAlone commits the record (args, completeSQL's) of a transaction a
// failed statement aborted, on its own connection: ROLLBACK, then the
// record's unfenced INSERT (section 9.1 says why a duplicate meanwhile is
// safe). A takeover's is rolled back and answered an error.
func (c *txClaim) recordAlone(ctx context.Context, args []any) (claim.TxEnd, error) {
	defer c.end()
	if !c.insert {
		return 0, errors.New("idemkey/store/postgres: complete in transaction: a failed statement aborted the transaction of a takeover; rolled back")
	}
	_, err := c.conn.Exec(ctx, "ROLLBACK")
	if err == nil {
		_, err = c.conn.Exec(ctx, c.t.aloneSQL, append(args, c.req.Fingerprint[:])...)
	}
	if err != nil {
		return 0, fmt.Errorf("idemkey/store/postgres: record of an aborted transaction: %w", err)
	}
	return claim.TxRecordAlone, nil
}

// failClosed ends a transaction the handler ended or left (cause): what
// committed is unknown, so the plain store claims the key for a lease under the
// same token, on another connection (this one's state is the handler's doing),
// and this one is closed. It returns ErrTxEnded wrapped.
func (c *txClaim) failClosed(ctx context.Context, cause error) error {
	_, cerr := c.t.Store.Claim(ctx, c.req)
	_ = c.conn.Conn().Close(ctx)
	c.conn.Release()
	return errors.Join(fmt.Errorf("idemkey/store/postgres: complete in transaction: %w: %w", claim.ErrTxEnded, cause), cerr)
}
