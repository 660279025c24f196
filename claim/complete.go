package claim

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idemkey/idemkey/store"
)

// minCompleteBackoff is the first back-off of completion retries; it doubles up
// to a third of the lease.
const minCompleteBackoff = 20 * time.Millisecond

// Complete stores resp, after Stop, in one attempt under the complete deadline:
// the only store call the caller waits for, so its client has its answer within
// the execution's own time plus one store bound.
//
// When that attempt fails with a store error (not ErrLeaseLost, ErrInvalid or
// ErrCorrupt) while the lease is still held, completion goes on in the
// background (pending true, err the attempt's error): the lease is renewed again
// and Complete retried with back-off (20 ms doubling, at most a third of the
// lease) until it succeeds, the lease is lost, the lease can no longer be held
// (no successful claim or renewal within the last lease), or the retries have
// lasted one lease. Until then duplicates are refused (in flight), never run a
// second time; the outcome is logged. e then belongs to that work: the caller
// must not reuse it (Reset). The work keeps its own copy of resp's header values
// and body: once Complete returns, the caller's buffers are its own again (a
// live response's header, which an outer middleware may edit, a pooled body).
func (e *Execution) Complete(resp store.Response) (pending bool, err error) {
	err = e.completeOnce(resp, true)
	if err == nil || !e.retryable(err, time.Now(), 0, minCompleteBackoff) {
		return false, err
	}
	resp.Header, resp.Body = resp.Header.Clone(), bytes.Clone(resp.Body)
	e.restart()
	e.cl.work.add() // done by completeLater
	go e.completeLater(resp, err)
	return true, err
}

// completeOnce makes one bounded Complete call; observed says whether it is
// reported to Config.Observe (the call on the caller's path, not the retries).
func (e *Execution) completeOnce(resp store.Response, observed bool) error {
	cl := e.cl
	ctx, cancel := cl.Bound(&e.ctx, cl.cfg.Timeouts.Complete)
	var d func(error)
	if observed {
		ctx, d = cl.observe(ctx, OpComplete, e.id)
	}
	err := cl.cfg.Store.Complete(ctx, e.id, e.token, resp, e.recordRetention())
	cancel()
	done(d, err)
	return err
}

// retryable reports whether a completion that failed with err, first at failed,
// after back-offs totalling waited, is tried again after backoff: a store error
// while the lease is held and can be held until then, and the retries have not
// lasted a lease (measured on both clocks: the back-offs' may be a test's).
func (e *Execution) retryable(err error, failed time.Time, waited, backoff time.Duration) bool {
	lease := e.cl.cfg.Lease
	return !errors.Is(err, store.ErrLeaseLost) && !errors.Is(err, store.ErrInvalid) && !errors.Is(err, store.ErrCorrupt) &&
		!e.renewLost.Load() && time.Since(e.heldAt())+backoff < lease && max(time.Since(failed), waited)+backoff <= lease
}

// completeLater retries the completion that failed with err (Complete), in its
// own goroutine, then stops the renewals and logs the outcome.
func (e *Execution) completeLater(resp store.Response, err error) {
	cl := e.cl
	defer cl.work.done()
	failed := time.Now()
	backoff := minCompleteBackoff
	var waited time.Duration // the back-offs so far, on the configured clock
	retries := 0
	for {
		retries++
		cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn,
			"idempotency store failed to complete; retrying in the background while the lease is held",
			slog.String("scope", e.id.Scope), slog.String("key", e.id.Key), slog.Int("retry", retries), slog.Any("error", err))
		wait := make(chan struct{})
		cl.cfg.Clock.AfterFunc(backoff, func() { close(wait) })
		<-wait
		waited += backoff
		backoff = min(2*backoff, max(cl.cfg.Lease/3, minCompleteBackoff))
		if err = e.completeOnce(resp, false); err == nil || !e.retryable(err, failed, waited, backoff) {
			break
		}
	}
	e.Stop()
	attrs := []slog.Attr{slog.String("scope", e.id.Scope), slog.String("key", e.id.Key), slog.Int("retries", retries)}
	switch {
	case err == nil:
		cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelInfo, "idempotency record completed in the background after retries", attrs...)
	case errors.Is(err, store.ErrLeaseLost) || e.renewLost.Load():
		// An attempt that timed out may still have landed (a hung server runs what
		// it was sent when it resumes): then the retry finds the record completed.
		cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn,
			"idempotency lease lost before completion; the response was not stored, unless an attempt that timed out landed (another request may have taken the key over)",
			append(attrs, slog.Any("error", err))...)
	default:
		cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelError,
			"idempotency store failed to complete; the key stays claimed until its lease expires",
			append(attrs, slog.Any("error", err))...)
	}
}
