package claim

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Execution is one claimed execution: the claim's token, its renewals, its
// completion or release, or the transaction that holds it (Tx). Run drives it
// from the store's answer to its end; the zero value is ready for it. One
// Execution serves one claim (it is not reused: a goroutine the execution left
// behind may still look at it). Start, Stop, Complete and Release are the steps
// Run takes, called from the executing goroutine; MarkCompleted and FromContext
// are safe from any.
type Execution struct {
	cl    *Claimer
	id    store.ID
	token store.Token
	ctx   detachedCtx
	lost  func(error) // cancels the execution's context on a lost lease
	hctx  *Context    // the execution's context, when it cancels itself (Context.Set)
	tx    Tx          // the transaction that holds the claim (TxStore); nil in the default mode

	// In-transaction completion (MarkCompleted), guarded by txMu: the executing
	// code may call it from any goroutine.
	txMu      sync.Mutex
	returned  bool // the execution returned; MarkCompleted is refused
	inTx      bool
	txResp    store.Response
	retention time.Duration // SetRetention's; 0: the Claimer's
	end       Ending        // how Run ended it

	released   bool
	releaseErr error
	sent       time.Time // when the claim was sent (monotonic)

	// Lease renewal.
	renewLost atomic.Bool  // a renewal found the lease lost (at any time)
	lostLive  atomic.Bool  // ... while the execution ran (LeaseLost)
	held      atomic.Int64 // when a renewal last held the lease: cl.epoch + held (its send); 0: none yet (sent)
	mu        sync.Mutex
	stopped   bool // no renewal is due (Stop; restart clears it)
	returnedE bool // the execution returned (Stop, returnedRun): a lost lease cancels nothing
	renewing  bool // a renewal's store call is in progress (not under mu)
	timer     Timer
	renewFn   func()
}

// detachedCtx keeps the caller's context values but not its cancellation, so
// Complete and Release still reach the store when the caller has gone. It is
// set once, before the execution's first store call, and never changes.
type detachedCtx struct{ parent context.Context }

func (d *detachedCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (d *detachedCtx) Done() <-chan struct{}       { return nil }
func (d *detachedCtx) Err() error                  { return nil }
func (d *detachedCtx) Value(k any) any {
	if d.parent == nil {
		return nil
	}
	return d.parent.Value(k)
}

// values returns the context whose values the execution's store calls keep.
func (e *Execution) values() context.Context {
	if e.ctx.parent == nil {
		return context.Background()
	}
	return e.ctx.parent
}

// Start begins the execution of the claim res answered (res.Outcome must be
// store.Claimed) for id, which was sent at sent (Claimer.Claim): the lease is
// renewed every third of it from then. values is the context whose values the
// store calls keep (not its cancellation). lost, if not nil, is called with
// store.ErrLeaseLost when a renewal finds the lease taken over: the caller
// cancels the execution's context with it (context.WithCancelCause); a Context
// set over a parent that is never cancelled cancels itself (no lost needed).
func (e *Execution) Start(cl *Claimer, values context.Context, id store.ID, token store.Token, sent time.Time, lost func(error)) {
	e.cl, e.lost = cl, lost
	e.ctx.parent = values
	e.id, e.token = id, token
	e.sent = sent
	if e.tx != nil { // the transaction holds the key: nothing to renew
		return
	}
	first := max(cl.cfg.Lease/3-time.Since(sent), 0)
	e.mu.Lock()
	e.arm(first)
	e.mu.Unlock()
}

// arm schedules the next renewal after d. Called with mu held.
func (e *Execution) arm(d time.Duration) {
	if e.timer == nil {
		e.renewFn = e.renew
		e.timer = e.cl.cfg.Clock.AfterFunc(d, e.renewFn)
		return
	}
	e.timer.Reset(d)
}

// ID returns the claimed scope and key.
func (e *Execution) ID() store.ID { return e.id }

// Token returns the claim's fencing token.
func (e *Execution) Token() store.Token { return e.token }

// renew runs on the clock's goroutine every third of the lease until stopped.
// Its store call runs outside mu, so Stop never waits for a hung store; a timer
// that fires while one is in progress does nothing (that one schedules the next).
func (e *Execution) renew() {
	e.mu.Lock()
	if e.stopped || e.renewing {
		e.mu.Unlock()
		return
	}
	e.renewing = true
	cl, id, token := e.cl, e.id, e.token
	e.mu.Unlock()
	at := cl.now()
	ctx, cancel := cl.Bound(&e.ctx, cl.cfg.Timeouts.Renew)
	err := cl.cfg.Store.Renew(ctx, id, token, cl.cfg.Lease)
	cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.renewing = false
	switch {
	case err == nil:
		e.held.Store(int64(at.Sub(cl.epoch)))
	case errors.Is(err, store.ErrLeaseLost):
		// Logged by the caller when it returns: a record completed in the caller's
		// own transaction also ends the lease, and is no loss. Once the execution
		// has returned there is no context left to cancel, and a refusal may be
		// the completion's own doing (a renewal that reached the store after the
		// record): it only stops the completion's retries (retryable).
		e.renewLost.Store(true)
		if !e.returnedE && !e.completedInTx() {
			e.lostLive.Store(true)
			if e.lost != nil {
				e.lost(store.ErrLeaseLost)
			}
			if e.hctx != nil {
				e.hctx.loseLease()
			}
		}
		return // nothing left to renew
	default:
		cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn, "idempotency lease renewal failed; retrying",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
	}
	if e.stopped {
		return
	}
	// The next renewal is due a third of the lease after this one was sent, not
	// after it returned: a renewal that ran out of its deadline (up to a third of
	// the lease) is retried at once, while the last one that reached the store
	// still holds the lease.
	e.timer.Reset(max(cl.cfg.Lease/3-cl.now().Sub(at), 0))
}

// LeaseLost reports whether a renewal found the lease taken over while the
// execution ran (before it returned). A renewal refused later, while the
// completion is pending, is not reported: the record it found may be this
// execution's own (the completion's result says what happened).
func (e *Execution) LeaseLost() bool { return e.lostLive.Load() }

// heldAt returns when the lease was last known held (claim or renewal sent, then
// succeeded), on the monotonic clock.
func (e *Execution) heldAt() time.Time {
	if h := e.held.Load(); h != 0 {
		return e.cl.epoch.Add(time.Duration(h))
	}
	return e.sent
}

// Returned closes the window of MarkCompleted (the execution returned) and
// reports whether the record was completed in the caller's own transaction, and
// with what response.
func (e *Execution) Returned() (inTx bool, resp store.Response) {
	e.txMu.Lock()
	defer e.txMu.Unlock()
	e.returned = true
	return e.inTx, e.txResp
}

// completedInTx reports whether MarkCompleted was called.
func (e *Execution) completedInTx() bool {
	e.txMu.Lock()
	defer e.txMu.Unlock()
	return e.inTx
}

// Stop stops the renewals, without waiting for one in progress (a hung store
// must not hold the caller: its answer is acted on only while the execution
// runs).
func (e *Execution) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopped, e.returnedE = true, true
	if e.timer != nil {
		e.timer.Stop()
	}
}

// returnedRun marks the execution returned, its renewals still due: they go on
// while its completion is pending (Complete stops them once it ends), so a
// completion slower than the rest of the lease never lets a duplicate take the
// key over after the caller has answered.
func (e *Execution) returnedRun() {
	e.mu.Lock()
	e.returnedE = true
	e.mu.Unlock()
}

// restart schedules renewals again after Stop, the next at once when the last
// one that reached the store was sent a third of the lease ago or more.
func (e *Execution) restart() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopped = false
	if !e.renewing {
		e.arm(max(e.cl.cfg.Lease/3-e.cl.now().Sub(e.heldAt()), 0))
	}
}

// Release releases the claim once (token-checked) and returns the store's error;
// never after MarkCompleted, whose record is committed (nil then). Renewals stop:
// an execution that goes on after it (a hijacked connection) is not cancelled by
// a renewal that finds the released claim gone. A failure is logged
// (ErrLeaseLost at warning level).
func (e *Execution) Release() error {
	if e.released || e.completedInTx() {
		return e.releaseErr
	}
	e.released = true
	e.mu.Lock()
	e.stopped, e.returnedE = true, true // the claim ends here: no renewal is due, no lease left to lose
	e.mu.Unlock()
	cl := e.cl
	if e.tx != nil { // the transaction holds the claim: roll it back
		ctx, cancel := cl.Bound(&e.ctx, cl.cfg.Timeouts.Release)
		ctx, d := cl.observe(ctx, OpRelease, e.id)
		e.releaseErr = e.tx.Rollback(ctx)
		cancel()
		done(d, e.releaseErr)
		return e.releaseErr
	}
	ctx, cancel := cl.Bound(&e.ctx, cl.cfg.Timeouts.Release)
	ctx, d := cl.observe(ctx, OpRelease, e.id)
	e.releaseErr = cl.cfg.Store.Release(ctx, e.id, e.token)
	cancel()
	done(d, e.releaseErr)
	if err := e.releaseErr; err != nil {
		level, msg := slog.LevelError, "idempotency claim release failed; retrying in the background"
		if errors.Is(err, store.ErrLeaseLost) || errors.Is(err, store.ErrInvalid) {
			level, msg = slog.LevelWarn, "idempotency claim release failed"
		} else {
			cl.releaseLater(e.values(), e.id, e.token) // fenced by the token: the key is freed once the store answers
		}
		cl.cfg.Logger.LogAttrs(context.Background(), level, msg,
			slog.String("scope", e.id.Scope), slog.String("key", e.id.Key), slog.Any("error", err))
	}
	return e.releaseErr
}

// Released reports whether Release ran.
func (e *Execution) Released() bool { return e.released }

// NotifyCompleted tells a store that keeps a copy of records
// (store.CompletionNotifier) that the record was completed in the caller's own
// transaction with resp, best effort. It does nothing for other stores. The
// retention it gives is what is left of the record's counted from when the claim
// was sent, a start no later than the caller's transaction (whose record's
// retention began inside it), so the copy never outlives the record.
func (e *Execution) NotifyCompleted(resp store.Response) {
	n, ok := e.cl.cfg.Store.(store.CompletionNotifier)
	if !ok {
		return
	}
	rest := e.recordRetention() - e.cl.now().Sub(e.sent)
	if rest < time.Millisecond {
		return
	}
	ctx, cancel := e.cl.Bound(&e.ctx, e.cl.cfg.Timeouts.Complete)
	n.NotifyCompleted(ctx, e.id, e.token, resp, rest)
	cancel()
}
