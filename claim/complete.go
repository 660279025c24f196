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

// Complete stores resp in one attempt under the complete deadline: the only
// store call the caller waits for, so its client has its answer within the
// execution's own time plus one store bound. The lease is renewed while the
// attempt runs (a renewal that reaches the store after the record is refused,
// and changes nothing); the renewals stop when the completion ends.
//
// When that attempt fails with a store error (not ErrLeaseLost, ErrInvalid or
// ErrCorrupt) while the lease is still held, completion goes on in the
// background (pending true, err the attempt's error): the lease is renewed
// and Complete retried with back-off (20 ms doubling, at most a third of the
// lease) until it succeeds, the lease is lost, the lease can no longer be held
// (no successful claim or renewal within the last lease), or the retries have
// lasted one lease. An attempt that failed without an answer and was followed
// by a refused renewal (its record may have landed) is tried once more: the
// store answers a completion already made with this token and response as
// done. Until then duplicates are refused (in flight), never run a second
// time; the outcome is logged. e then belongs to that work. The work keeps its
// own copy of resp's header values and body: once Complete returns, the
// caller's buffers are its own again (a live response's header, which an outer
// middleware may edit, a pooled body).
func (e *Execution) Complete(resp store.Response) (pending bool, err error) {
	err = e.completeOnce(resp, true)
	if err == nil || !e.retryable(err, time.Now(), 0, minCompleteBackoff) && !e.mayHaveCompleted(err) {
		e.Stop()
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

// refusal reports whether err is an answer of the store that no retry changes.
func refusal(err error) bool {
	return errors.Is(err, store.ErrLeaseLost) || errors.Is(err, store.ErrInvalid) || errors.Is(err, store.ErrCorrupt)
}

// mayHaveCompleted reports whether an attempt that failed with err, without the
// store's answer, may have completed the record: a renewal was refused since,
// as it is once the record is complete. One more attempt tells (a store answers
// a completion of the record by the same token with the same response as done).
func (e *Execution) mayHaveCompleted(err error) bool {
	return !refusal(err) && e.renewLost.Load()
}

// retryable reports whether a completion that failed with err, first at failed,
// after back-offs totalling waited, is tried again after backoff: a store error
// while the lease is held and can be held until then, and the retries have not
// lasted a lease (measured on both clocks: the back-offs' may be a test's).
func (e *Execution) retryable(err error, failed time.Time, waited, backoff time.Duration) bool {
	lease := e.cl.cfg.Lease
	return !refusal(err) && !e.renewLost.Load() && time.Since(e.heldAt())+backoff < lease && max(time.Since(failed), waited)+backoff <= lease
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
		lostBefore := e.renewLost.Load()
		err = e.completeOnce(resp, false)
		if err == nil || !e.retryable(err, failed, waited, backoff) && (lostBefore || !e.mayHaveCompleted(err)) {
			break
		}
	}
	e.Stop()
	attrs := []slog.Attr{slog.String("scope", e.id.Scope), slog.String("key", e.id.Key), slog.Int("retries", retries)}
	switch {
	case err == nil:
		cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelInfo, "idempotency record completed in the background after retries", attrs...)
	case errors.Is(err, store.ErrLeaseLost) || e.renewLost.Load():
		// An attempt that timed out and landed (a hung server runs what it was sent
		// when it resumes) is answered as done by the next one: this is a loss.
		cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn,
			"idempotency lease lost before completion; the response was not stored (another request may have taken the key over)",
			append(attrs, slog.Any("error", err))...)
	default:
		cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelError,
			"idempotency store failed to complete; the key stays claimed until its lease expires",
			append(attrs, slog.Any("error", err))...)
	}
}
