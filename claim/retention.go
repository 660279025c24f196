package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkey/idemkey/store"
)

// SetRetention sets how long the record of the execution whose context ctx is
// (or derives from) is kept once completed, instead of the Claimer's retention:
// a d over Config.MaxRetention is clamped to it. The last call before the
// execution returns wins; FromContext then reports it as Claim.Retention, which
// is what a completion in the caller's own transaction (store/postgres
// CompleteTx) should be given. Errors: ErrNoClaim when ctx carries no claim or
// the execution has returned; an error wrapping store.ErrInvalid for d <= 0.
func SetRetention(ctx context.Context, d time.Duration) error {
	c, ok := ctx.Value(ctxKey{}).(*Context)
	if !ok || c.exec == nil {
		return ErrNoClaim
	}
	if d <= 0 {
		return fmt.Errorf("%w: idemkey/claim: retention %v must be positive", store.ErrInvalid, d)
	}
	e := c.exec
	e.txMu.Lock()
	defer e.txMu.Unlock()
	if e.token != c.claim.Token || e.id != c.claim.ID || e.returned {
		return ErrNoClaim
	}
	e.retention = min(d, e.cl.cfg.MaxRetention)
	return nil
}

// retentionOf returns SetRetention's retention while e still executes cl (ok
// false when it was not called, or e has moved on to another claim).
func (e *Execution) retentionOf(cl Claim) (time.Duration, bool) {
	e.txMu.Lock()
	defer e.txMu.Unlock()
	if e.retention == 0 || e.token != cl.Token || e.id != cl.ID {
		return 0, false
	}
	return e.retention, true
}

// recordRetention returns the retention the record is completed with. Once
// Returned ran, SetRetention refuses: the retention no longer changes, and the
// executing goroutine (or one it started since) reads it without the lock.
func (e *Execution) recordRetention() time.Duration {
	if !e.returned { // written only by the executing goroutine
		e.txMu.Lock()
		defer e.txMu.Unlock()
	}
	if e.retention > 0 {
		return e.retention
	}
	return e.cl.cfg.Retention
}
