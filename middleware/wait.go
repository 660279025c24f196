package middleware

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
)

// Back-off of waiting duplicates (WithWaitInFlight): after a wake-up that still
// found the key in flight, the next claim comes no sooner than the back-off
// after the previous one (doubling from waitBackoffMin up to waitBackoffMax), so
// a store whose notification fires without the claim ending (a tiered store's
// stale marker), or a store without notifications (polled), is never claimed in
// a busy loop.
const (
	waitBackoffMin = time.Millisecond
	waitBackoffMax = 250 * time.Millisecond
)

// WithWaitInFlight lets a duplicate that finds its key in flight (same
// fingerprint, the original's lease live) wait up to d for the original's
// answer instead of the immediate 409 request_in_flight: when the original
// completes, the duplicate gets the replay; when it releases the key (a 5xx, a
// panic, ...), the duplicate claims it and runs the handler; when its lease
// expires, the duplicate takes it over and runs. Past d, or when the request's
// context ends during a wait (client gone, the request's own deadline), the
// answer is the 409 with Retry-After as without waiting. A claim after a
// wake-up is not cut short by the client leaving (unless WithCancelOnDisconnect),
// only by the claim timeout, like the request's first claim: what it finds is
// then served as usual (a replay written to a gone client, or a run of the
// handler, whose answer is stored for the retry). It sets
// policy.Config.WaitInFlight: 0, the default, is no waiting; New refuses a
// negative d.
//
// The wait is woken by the store's notification when it implements
// store.Waiter (memory: an in-process channel; postgres: LISTEN/NOTIFY on one
// connection per store; redis: a PUBLISH from the scripts to one subscription
// per store; tiered: its backstop's, then its cache's), otherwise by polling
// with back-off (1 ms doubling to 250 ms). A waiting duplicate makes one Wait
// call and one more Claim per wake-up: a duplicate that waits for one completion
// costs three store calls instead of one. Each Claim runs under the claim
// timeout (policy.StoreFailureRule.Timeouts); the wait itself is bounded by d, by the remaining
// lease and by the request's context (its deadline, its client leaving), not by
// the store timeouts (docs/architecture.md section 3).
func WithWaitInFlight(d time.Duration) Option { return func(c *config) { c.pol.WaitInFlight = d } }

// waitInFlight waits, while res is InFlight and the bound allows, for the claim
// to end and claims again. It returns the last claim's answer (InFlight when the
// bound, the lease or the request's context ran out first), the store time spent
// in claims, and the time spent waiting. The waits end with ctx (the request's
// context: a client gone waits no longer); each claim runs on claimCtx, the
// context the first claim ran on (by default detached from the client's
// hang-up, so a claim the store made is never abandoned half-way: it would
// answer 409 until its lease ends, and the hang-up would count as an outage).
//
// In the one-transaction mode (tx not nil) each claim itself waits on the
// holder's transaction (its lock wait), so there is no Wait call and no
// back-off; a claim that wins leaves its transaction in *tx.
func (m *Middleware) waitInFlight(ctx, claimCtx context.Context, req store.ClaimRequest, res store.ClaimResult, sent time.Time, tx *claim.Tx) (_ store.ClaimResult, _ time.Time, claimTime, waited time.Duration, err error) {
	start := time.Now()
	deadline := start.Add(m.wait)
	waiter, _ := m.store.(store.Waiter)
	if tx != nil {
		waiter = nil
	}
	backoff := time.Duration(0) // no floor before the first wake-up
	last := start               // the previous claim
	defer func() { waited = time.Since(start) - claimTime }()
	for res.Outcome == store.InFlight {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			break
		}
		// Wake at the holder's lease end at the latest: then the claim takes over.
		d := min(left, res.RetryAfter+waitBackoffMin)
		if waiter != nil {
			wctx, cancel := context.WithTimeout(ctx, d)
			callCtx, done := m.storeCall(wctx, StoreWait, req.ID)
			werr := waiter.Wait(callCtx, req.ID)
			if werr != nil && (ctx.Err() != nil || wctx.Err() != nil && errors.Is(werr, context.DeadlineExceeded)) {
				// The wait's own bound or the client's leaving ended it: not a
				// failure of the store.
				storeDone(done, nil)
			} else {
				storeDone(done, werr)
			}
			cancel()
			if errors.Is(werr, errors.ErrUnsupported) {
				waiter = nil // this store cannot wait: poll
				continue
			}
			if werr != nil && ctx.Err() == nil && !errors.Is(werr, context.DeadlineExceeded) {
				m.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency store could not wait for the claim in flight; answering 409",
					slog.String("scope", req.Scope), slog.String("key", req.Key), slog.Any("error", werr))
				break
			}
		}
		// The back-off floor: no claim sooner than backoff after the previous one
		// (all of d when polling).
		floor := backoff
		if tx != nil {
			floor = 0
		} else if waiter == nil {
			floor = min(max(backoff, waitBackoffMin), d)
		}
		if rest := floor - time.Since(last); rest > 0 {
			if !sleepCtx(ctx, min(rest, time.Until(deadline))) {
				break
			}
		}
		if ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		if tx != nil {
			res, *tx, sent, err = m.claimer.ClaimTx(claimCtx, req)
		} else {
			res, sent, err = m.claimer.Claim(claimCtx, req)
		}
		claimTime += time.Since(t0)
		last = time.Now()
		if err != nil {
			return res, sent, claimTime, 0, err
		}
		backoff = min(max(2*backoff, waitBackoffMin), waitBackoffMax)
	}
	return res, sent, claimTime, 0, nil
}

// sleepCtx waits d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
