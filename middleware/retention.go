package middleware

import (
	"context"
	"time"

	"github.com/idemkey/idemkey/claim"
)

// WithMaxRetention sets the longest retention SetRetention may give a record
// (default: the retention, WithRetention, so a handler may only shorten its
// record's life unless this is raised). New refuses a maximum shorter than the
// retention, or negative.
func WithMaxRetention(d time.Duration) Option { return func(c *config) { c.maxRetention = d } }

// SetRetention sets how long the record of the request whose context ctx is (or
// derives from) is kept and replayed, instead of the middleware's retention
// (WithRetention), counted from its completion on the store's clock: e.g. a
// failed validation kept 10 minutes, a payment 30 days. A d over the maximum
// (WithMaxRetention) is clamped to it. The last call before the handler returns
// wins; Claim.Retention (ClaimFromContext) reports the retention in force, which
// store/postgres CommitResponse and CompleteTx are given for a record completed
// in the handler's transaction. The in-flight record keeps the middleware's
// retention until completion (claim.SetRetention).
//
// Errors: ErrNoClaim when ctx carries no claim (see ErrNoClaim) or the handler
// has returned; an error wrapping store.ErrInvalid for d <= 0. See
// docs/request-rules.md section 5.
func SetRetention(ctx context.Context, d time.Duration) error { return claim.SetRetention(ctx, d) }
