package middleware

import (
	"context"
	"time"

	"github.com/idemkey/idemkey/claim"
)

// SetRetention sets how long the record of the request whose context ctx is (or
// derives from) is kept and replayed, instead of the middleware's retention
// (RetentionRule.Default), counted from its completion on the store's clock: e.g. a
// failed validation kept 10 minutes, a payment 30 days. A d over the maximum
// (RetentionRule.Max) is clamped to it. The last call before the handler returns
// wins; Claim.Retention (ClaimFromContext) reports the retention in force, which
// store/postgres CommitResponse and CompleteTx are given for a record completed
// in the handler's transaction. The in-flight record keeps the middleware's
// retention until completion (claim.SetRetention).
//
// Errors: ErrNoClaim when ctx carries no claim (see ErrNoClaim) or the handler
// has returned; an error wrapping store.ErrInvalid for d <= 0. See
// docs/request-rules.md section 5.
func SetRetention(ctx context.Context, d time.Duration) error { return claim.SetRetention(ctx, d) }
