package middleware

import (
	"context"
	"errors"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Claim is the claim a protected request's handler runs under. A handler whose
// side effect lives in the same database as the store completes the record inside
// its own transaction with it (store/postgres CompleteTx and CommitResponse), so
// the record and the side effect commit together (docs/architecture.md section 9).
type Claim struct {
	// ID is the scope and idempotency key.
	ID store.ID
	// Token is the fencing token the claim holds: a completion under it succeeds
	// only while no other request has taken the key over.
	Token store.Token
	// Fingerprint is the request's fingerprint (package fingerprint).
	Fingerprint store.Fingerprint
	// Takeover is set when the previous holder's lease expired and this request took
	// the key over: the previous execution's side effects may already have happened
	// (unless they were fenced by the token in the same transaction).
	Takeover bool
	// Retention is what the middleware would give Store.Complete: how long the
	// record is kept and replayed (WithRetention).
	Retention time.Duration
}

// ErrNoClaim is returned by MarkCompleted when the context carries no claim: the
// request was not protected, passed through without a key, ran unprotected
// (WithFailOpen), or its handler has already returned.
var ErrNoClaim = errors.New("idemkey/middleware: no idempotency claim in the context")

// ClaimFromContext returns the claim the handler of the request whose context ctx
// is (or derives from) runs under. ok is false when the request runs without one
// (see ErrNoClaim).
func ClaimFromContext(ctx context.Context) (Claim, bool) {
	c, ok := ctx.Value(ctxKey{}).(*keyCtx)
	if !ok {
		return Claim{}, false
	}
	return c.claim()
}

// MarkCompleted tells the middleware that the handler completed the claim's record
// itself with resp, inside its own transaction, which has committed (store/postgres
// CompleteTx): the middleware then does not call Store.Complete, and does not
// release the claim whatever status the handler answers. If the store implements
// store.CompletionNotifier (store/tiered), it is told after the handler returns, so
// a cache learns of the record. resp must not be modified afterwards.
//
// What retries replay is resp, the committed record, even if the handler writes
// something else to the client. store/postgres CommitResponse writes resp itself, so
// the two agree.
//
// Call it from the handler (or a goroutine it waits for) before the handler
// returns; ErrNoClaim when ctx carries no claim or the handler has returned.
func MarkCompleted(ctx context.Context, resp store.Response) error {
	k, ok := ctx.Value(ctxKey{}).(*keyCtx)
	if !ok || k.call == nil {
		return ErrNoClaim
	}
	c := k.call
	c.txMu.Lock()
	defer c.txMu.Unlock()
	if c.token != k.token || c.id != k.id || c.returned {
		return ErrNoClaim
	}
	c.inTx, c.txResp = true, resp
	return nil
}
