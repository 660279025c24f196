package claim

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Background releases. A claim the store did not answer in time may still land
// (a hung server runs the statement when it resumes), and a release that failed
// (a restart) leaves its claim held: either would answer 409 to every retry until
// the lease ends. Since the token is generated before the send (Claimer.Claim),
// such a claim can be released, fenced by it, once the store answers again: one
// goroutine per Claimer does so, one call at a time, with back-off while the store
// fails.
const (
	// minReleaseBackoff is the first pause after a failed background release; it
	// doubles up to maxReleaseBackoff, so a store that answers again is noticed
	// within half a second.
	minReleaseBackoff = 50 * time.Millisecond
	maxReleaseBackoff = 500 * time.Millisecond
	// lostChecks is how many times a claim whose answer was lost is released again
	// after the store answered ErrLeaseLost (the claim may land after the first
	// release, on another connection), 100 ms apart and doubling.
	lostChecks = 3
	// maxPendingReleases bounds the queue; a release beyond it is dropped (logged
	// when the queue drains) and its lease ends on its own.
	maxPendingReleases = 4096
	// minReleaseHorizon is the least time a pending release is retried while the
	// store fails; the horizon is six leases when longer.
	minReleaseHorizon = time.Minute
)

// pendingRelease is a claim to release in the background.
type pendingRelease struct {
	id     store.ID
	token  store.Token
	values context.Context // the caller's values, none of its cancellation
	queued time.Time       // monotonic
	due    time.Time       // monotonic
	lost   int             // ErrLeaseLost answers so far
}

// releaser holds the background releases of a Claimer.
type releaser struct {
	mu      sync.Mutex
	pending []pendingRelease
	running bool // the worker runs or is scheduled
	dropped int  // releases refused since the queue last drained

	// Used by the worker only (one at a time).
	backoff   time.Duration // the pause after the latest store failure
	notBefore time.Time     // the store failed: no call before then (monotonic)
}

// releaseLater queues the release of id's claim under token, and starts the
// goroutine that works the queue if it is not running.
func (cl *Claimer) releaseLater(values context.Context, id store.ID, token store.Token) {
	r := &cl.releases
	now := cl.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.pending) >= maxPendingReleases {
		r.dropped++
		return
	}
	r.pending = append(r.pending, pendingRelease{id: id, token: token, values: context.WithoutCancel(values), queued: now, due: now})
	if !r.running {
		r.running = true
		cl.work.add() // done when the queue drains (next)
		go cl.releaseLoop()
	}
}

// next takes the pending release due first out of the queue. When the queue is
// empty it reports so, and the worker stops (dropped is the count of releases
// refused since it last drained); when the first is not due yet, it returns its
// wait, and the worker schedules itself on the clock instead of sleeping.
func (r *releaser) next(now, notBefore time.Time) (p pendingRelease, wait time.Duration, dropped int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.pending) == 0 {
		r.running = false
		dropped, r.dropped = r.dropped, 0
		return p, 0, dropped, false
	}
	first := 0
	for i := range r.pending {
		if r.pending[i].due.Before(r.pending[first].due) {
			first = i
		}
	}
	at := r.pending[first].due
	if notBefore.After(at) {
		at = notBefore
	}
	if wait = at.Sub(now); wait > 0 {
		return p, wait, 0, true
	}
	p = r.pending[first]
	last := len(r.pending) - 1
	r.pending[first] = r.pending[last]
	r.pending[last] = pendingRelease{}
	r.pending = r.pending[:last]
	return p, 0, 0, true
}

func (r *releaser) requeue(p pendingRelease) {
	r.mu.Lock()
	r.pending = append(r.pending, p)
	r.mu.Unlock()
}

// releaseLoop works the queue until it is empty, or until its first release is
// not due yet: then it runs again on the clock (no goroutine waits meanwhile).
func (cl *Claimer) releaseLoop() {
	r := &cl.releases
	horizon := max(minReleaseHorizon, 6*cl.cfg.Lease)
	for {
		p, wait, dropped, ok := r.next(cl.now(), r.notBefore)
		switch {
		case !ok:
			if dropped > 0 {
				cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn,
					"idempotency background releases dropped (queue full); their leases end on their own",
					slog.Int("dropped", dropped))
			}
			cl.work.done()
			return
		case wait > 0:
			cl.cfg.Clock.AfterFunc(wait, cl.releaseLoop)
			return
		}
		err := cl.releaseOnce(p)
		now := cl.now()
		switch {
		case err == nil:
			cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelInfo, "idempotency claim released in the background",
				slog.String("scope", p.id.Scope), slog.String("key", p.id.Key))
		case errors.Is(err, store.ErrInvalid):
		case errors.Is(err, store.ErrLeaseLost):
			r.backoff, r.notBefore = 0, time.Time{} // the store answers
			if p.lost++; p.lost <= lostChecks {
				p.due = now.Add(100 * time.Millisecond << (p.lost - 1))
				r.requeue(p)
			}
		default:
			r.backoff = min(max(2*r.backoff, minReleaseBackoff), maxReleaseBackoff)
			r.notBefore = now.Add(r.backoff)
			if now.Sub(p.queued) < horizon {
				r.requeue(p)
				continue
			}
			cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn, "idempotency background release given up; the lease ends on its own",
				slog.String("scope", p.id.Scope), slog.String("key", p.id.Key), slog.Any("error", err))
		}
	}
}

// releaseOnce makes one bounded release call of p. Like renewals, background
// releases are off the caller's path and not reported to Config.Observe.
func (cl *Claimer) releaseOnce(p pendingRelease) error {
	ctx, cancel := cl.Bound(p.values, cl.cfg.Timeouts.Release)
	err := cl.cfg.Store.Release(ctx, p.id, p.token)
	cancel()
	return err
}

// mayHaveLanded reports whether a claim that failed with err may still have been
// made by the store: any failure but a refusal the store answered (invalid
// arguments, a corrupt record, a full store).
func mayHaveLanded(err error) bool {
	return err != nil && !errors.Is(err, store.ErrInvalid) && !errors.Is(err, store.ErrCorrupt) && !errors.Is(err, store.ErrFull)
}
