package claim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkey/idemkey/store"
)

// TxStore is the optional capability of a store whose claim can live in the
// transaction the execution runs in (the one-transaction mode,
// docs/architecture.md section 9.1): the claim, the caller's own statements and
// the record commit once, or not at all. Callers select it explicitly, per route
// or per call (middleware.Middleware.OneTx, idem.Runner.DoTx); nothing else
// changes what the store's other methods do. store/postgres TxStore implements
// it.
type TxStore interface {
	store.Store
	// ClaimTx claims req (Lease, Retention and Token filled in) in a new
	// transaction. When it answers store.Claimed, tx holds the key until its
	// Commit or Rollback, and the caller's statements run in it (the store's own
	// accessor, store/postgres TxFromContext); for any other outcome tx is nil and
	// nothing is left open. Errors as Store.Claim's.
	ClaimTx(ctx context.Context, req store.ClaimRequest) (res store.ClaimResult, tx Tx, err error)
}

// Tx is a claim held by an open transaction (TxStore.ClaimTx). Run calls one of
// its methods, once, after the execution returned. A store in front of another
// (store/tiered) that wraps the other's Tx gives it back with a method
// Unwrap() Tx, so the other's accessor finds it.
type Tx interface {
	// Commit writes the record resp, kept for retention, in the transaction and
	// commits it, after the server checked that this transaction still holds the
	// key (a fence no other transaction can pass). A transaction that a failed
	// statement aborted is rolled back, and the record committed on its own
	// (TxRecordAlone): nothing of the caller's committed, and retries replay resp.
	// Errors: ErrTxEnded when the caller ended or left the transaction; one
	// wrapping store.ErrLeaseLost when the server refused the record (nothing
	// committed); otherwise the store's error (the commit's outcome may be
	// unknown). On every error the connection is given back, the transaction
	// ended.
	Commit(ctx context.Context, resp store.Response, retention time.Duration) (TxEnd, error)
	// Rollback ends the transaction without a record: the caller's statements are
	// undone and the key is free.
	Rollback(ctx context.Context) error
}

// TxEnd says how Tx.Commit committed.
type TxEnd uint8

const (
	// TxCommitted: the caller's statements and the record committed together.
	TxCommitted TxEnd = iota
	// TxRecordAlone: a failed statement had aborted the caller's transaction:
	// it was rolled back and the record committed on its own.
	TxRecordAlone
)

// ErrTxEnded is returned (wrapped) by Tx.Commit when the caller ended its
// transaction itself (COMMIT, ROLLBACK, through its connection) or the store can
// no longer tell what committed: the store kept the key claimed for a lease
// (duplicates are answered in flight meanwhile, then the key is taken over), and
// the caller's client gets a store failure (503), never a success for rows that
// may not exist.
var ErrTxEnded = errors.New("idemkey/claim: the execution's transaction was ended or left outside the library")

// TxFromContext returns the transaction that holds the claim of the execution
// whose context ctx is (or derives from), while it executes: ok is false in the
// default mode, without a claim, or once the execution has returned. A store
// offers the transaction to the caller's code through its own typed accessor
// built on it (store/postgres TxFromContext).
func TxFromContext(ctx context.Context) (Tx, bool) {
	c, ok := ctx.Value(ctxKey{}).(*Context)
	if !ok || c.exec == nil || c.exec.tx == nil {
		return nil, false
	}
	e := c.exec
	e.txMu.Lock()
	defer e.txMu.Unlock()
	if e.returned {
		return nil, false
	}
	return e.tx, true
}

// HoldsTx reports whether the store holds claims in transactions: a TxStore
// that, if it says so (a HoldsTx method: a store in front of another, as
// store/tiered), does.
func (cl *Claimer) HoldsTx() bool {
	_, ok := cl.cfg.Store.(TxStore)
	if h, says := cl.cfg.Store.(interface{ HoldsTx() bool }); ok && says {
		return h.HoldsTx()
	}
	return ok
}

// ClaimTx is Claim in the transaction mode (TxStore.ClaimTx): the same defaults,
// deadline, observation and checks; tx is not nil exactly when the store
// answered store.Claimed. A claim whose answer was lost needs no release: its
// transaction ends with its connection. An error wrapping store.ErrInvalid when
// the store is no TxStore.
func (cl *Claimer) ClaimTx(ctx context.Context, req store.ClaimRequest) (res store.ClaimResult, tx Tx, sent time.Time, err error) {
	ts, ok := cl.cfg.Store.(TxStore)
	if !ok {
		return res, nil, sent, fmt.Errorf("%w: idemkey/claim: the store holds no claim in a transaction (claim.TxStore)", store.ErrInvalid)
	}
	if req.Lease == 0 {
		req.Lease = cl.cfg.Lease
	}
	if req.Retention == 0 {
		req.Retention = cl.cfg.Retention
	}
	if req.Token.IsZero() {
		req.Token = store.NewToken()
	}
	sent = cl.now()
	cctx, cancel := cl.Bound(ctx, cl.cfg.Timeouts.Claim)
	cctx, d := cl.observe(cctx, OpClaim, req.ID)
	res, tx, err = ts.ClaimTx(cctx, req)
	cancel()
	done(d, err)
	if err == nil && (res.Outcome < store.Claimed || res.Outcome > store.Mismatch ||
		res.Outcome == store.Completed && res.Record == nil || res.Outcome == store.Claimed && (res.Token.IsZero() || tx == nil)) {
		err = fmt.Errorf("%w: idemkey/claim: store answered an invalid claim result (outcome %v)", store.ErrCorrupt, res.Outcome)
	}
	if err != nil && tx != nil {
		rctx, cancel := cl.Bound(context.WithoutCancel(ctx), cl.cfg.Timeouts.Release)
		_ = tx.Rollback(rctx)
		cancel()
		tx = nil
	}
	return res, tx, sent, err
}
