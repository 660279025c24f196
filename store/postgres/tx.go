package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
)

// ErrCommitUnknown is returned (wrapped, next to the driver's error) by
// CommitResponse when the commit of the handler's transaction failed: whether it
// committed is not known (the connection may have dropped after the server
// committed). The handler answers 5xx; the middleware then releases the claim,
// fenced by the token and by the record being uncompleted, so a record that did
// commit is kept and replayed, and one that did not is forgotten and the retry runs.
var ErrCommitUnknown = errors.New("idemkey/store/postgres: commit outcome unknown")

// errCommitInOneTx: CommitResponse in the one-transaction mode.
var errCommitInOneTx = fmt.Errorf("idemkey/store/postgres: CommitResponse in the one-transaction mode (the record commits with the route's transaction: answer through the ResponseWriter): %w", claim.ErrOneTx)

// CompleteTx completes id's record inside the caller's transaction tx, fenced by
// token: one UPDATE of the store's table, no other round trip. It is the
// in-transaction form of Complete (same arguments, validation and encoding), for a
// handler whose side effect lives in the same database: the record and the side
// effect then commit or roll back together (docs/architecture.md section 9).
//
// Errors: store.ErrLeaseLost (wrapped) when token no longer owns the key (its lease
// expired and a retry took the key over, or the record expired): the caller must
// roll back, so a stale holder's side effect never commits. store.ErrInvalid for bad
// arguments (nothing sent), otherwise the driver's error wrapped; tx is left to the
// caller either way.
//
// tx may be any pgx.Tx: from pool.Begin (*pgxpool.Pool), conn.Begin on a checkout
// or a *pgx.Conn, or a nested (savepoint) transaction, in the store's database (the
// store's table is named as the store was configured). The UPDATE locks the record's
// row until tx ends, so keep the transaction short after it: a retry that takes
// over an expired lease waits for it. The record's completion time and retention
// are counted from the transaction's start (Postgres now()).
//
// After commit, tell the execution with claim.MarkCompleted (the middleware's
// MarkCompleted is the same function), or use CommitResponse, which does both.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if tx == nil {
		return fmt.Errorf("idemkey/store/postgres: %w: nil transaction", store.ErrInvalid)
	}
	if err := s.checkComplete(id, token, resp, retention); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, s.completeSQL, s.withMode(s.completeArgs(id, token, resp, retention)...)...)
	return holderResult("complete in transaction", tag, poolerErr(err))
}

// CommitResponse is the common end of a handler that writes its own rows in tx: it
// takes the claim from ctx (claim.FromContext, which the middleware and idem set),
// completes the record with resp in tx (CompleteTx), commits tx, tells the
// execution (claim.MarkCompleted, so it does not complete again) and writes resp to w: its headers, status and
// body. resp is what every retry replays; write nothing else to w, before or
// afterwards (if the handler does, this client sees it, the retries still get
// resp: a status written before wins over resp's for this client only). A second
// call for the same claim finds the record completed: store.ErrLeaseLost, its tx
// rolled back. resp.Header should hold only headers worth replaying (no
// Set-Cookie, Date, Content-Length).
//
// Deadline: when ctx has none (the middleware's handler context, detached from
// the client's, has none), the completion and the commit together are bounded by
// the claim's CompleteTimeout (StoreFailureRule.Timeouts.Complete;
// claim.DefaultStoreTimeout when zero), so a hung server is answered within the
// bound: a commit that runs out of it is ErrCommitUnknown.
//
// tx must be the top-level transaction (commit ends it in the database). On every
// error tx is finished (rolled back, or its commit failed) and nothing was written
// to w:
//   - claim.ErrOneTx (wrapped) in the one-transaction mode (TxFromContext answers
//     a transaction): the record commits with the route's transaction, so nothing
//     is sent or written (tx is rolled back; the route's own transaction refuses
//     that, ErrTxOwned, and goes on); answer through w and return;
//   - claim.ErrNoClaim when ctx carries no claim (the route is not behind the
//     middleware, or the request passed through without a key); the one exception
//     to "tx is finished and nothing committed": called after the handler returned
//     (from a goroutine the handler did not wait for), tx has committed before
//     MarkCompleted refuses, and the record is resp;
//   - store.ErrLeaseLost (wrapped) when the claim was taken over: tx was rolled
//     back, none of its rows exist; answer 409 (the retry that took over runs);
//   - ErrCommitUnknown (wrapped, with the driver's error) when the commit failed
//     or ran out of its deadline: answer 5xx, see ErrCommitUnknown;
//   - store.ErrInvalid for a response a store cannot keep, or the driver's error of
//     the UPDATE: tx was rolled back.
func (s *Store) CommitResponse(ctx context.Context, tx pgx.Tx, w http.ResponseWriter, resp store.Response) error {
	if tx == nil {
		return fmt.Errorf("idemkey/store/postgres: %w: nil transaction", store.ErrInvalid)
	}
	cl, ok := claim.FromContext(ctx)
	if !ok {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return claim.ErrNoClaim
	}
	if _, oneTx := claim.TxFromContext(ctx); oneTx { // as MarkCompleted refuses it, before any statement
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return errCommitInOneTx
	}
	bctx, cancel := boundContext(ctx, cl)
	defer cancel()
	if err := s.CompleteTx(bctx, tx, cl.ID, cl.Token, resp, cl.Retention); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	cctx, cancelCommit := commitContext(bctx)
	err := tx.Commit(cctx)
	cancelCommit()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCommitUnknown, err)
	}
	if err := claim.MarkCompleted(ctx, resp); err != nil {
		// Called after the handler returned (from a goroutine it did not wait for):
		// tx has committed, and the record is resp; only this client gets nothing.
		return err
	}
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	w.WriteHeader(resp.Status)
	if len(resp.Body) > 0 {
		_, _ = w.Write(resp.Body) // a failed write is the client's loss: retries replay resp
	}
	return nil
}

// boundContext returns ctx bounded by the claim's completion deadline
// (cl.CompleteTimeout, claim.DefaultStoreTimeout when zero) when ctx has none:
// the middleware's handler context is detached from the client's and has no
// deadline, and a hung server must not hold the completion and the commit until
// TCP gives up.
func boundContext(ctx context.Context, cl claim.Claim) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	d := cl.CompleteTimeout
	if d <= 0 {
		d = claim.DefaultStoreTimeout
	}
	return context.WithTimeout(ctx, d)
}

// commitContext returns the context of the commit: ctx's values and deadline, not
// its cancellation. A commit once sent is not abandoned: cancelling it only makes
// its outcome unknown. And the claim's own renewal cancels ctx just then: waiting
// on the row lock CompleteTx holds, it finds the record completed the moment the
// commit releases it, and reports the lease lost while the commit's answer is on
// its way.
func commitContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(context.WithoutCancel(ctx), d)
	}
	return context.WithoutCancel(ctx), func() {}
}
