package middleware

import (
	"context"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
)

// Claim is the claim a protected request's handler runs under (package claim);
// its Retention is what the middleware gives Store.Complete (RetentionRule.Default).
type Claim = claim.Claim

// ErrNoClaim is returned by MarkCompleted when the context carries no claim: the
// request was not protected, passed through without a key, ran unprotected
// (StoreFailureRule.FailOpen), or its handler has already returned (claim.ErrNoClaim).
var ErrNoClaim = claim.ErrNoClaim

// ClaimFromContext returns the claim the handler of the request whose context ctx
// is (or derives from) runs under (claim.FromContext). ok is false when the
// request runs without one (see ErrNoClaim).
func ClaimFromContext(ctx context.Context) (Claim, bool) { return claim.FromContext(ctx) }

// MarkCompleted tells the middleware that the handler completed the claim's record
// itself with resp, inside its own transaction, which has committed (store/postgres
// CompleteTx; claim.MarkCompleted): the middleware then does not call
// Store.Complete, and does not release the claim whatever status the handler
// answers. If the store implements store.CompletionNotifier (store/tiered), it is
// told after the handler returns, so a cache learns of the record. resp must not
// be modified afterwards.
//
// What retries replay is resp, the committed record, even if the handler writes
// something else to the client. store/postgres CommitResponse writes resp itself, so
// the two agree.
//
// Call it from the handler (or a goroutine it waits for) before the handler
// returns; ErrNoClaim when ctx carries no claim or the handler has returned.
func MarkCompleted(ctx context.Context, resp store.Response) error {
	return claim.MarkCompleted(ctx, resp)
}
