package claim

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/store"
)

// answerGrace is how long the caller's answer waits for the release or the
// completion of the default mode once its function returned: a healthy store
// has answered long before, so a client that retries at once meets the
// released key or the record; a slow or hung store does not delay the answer
// further, and the call goes on in the background, fenced by the token (the
// key stays safe: a completion still pending keeps duplicates in flight, a
// release still pending keeps them out until it lands or the lease ends).
const answerGrace = time.Second

// Claimed is a claim the store granted (store.Claimed): what Run executes.
type Claimed struct {
	// Claim is the claim, as the execution's context carries it (FromContext).
	Claim Claim
	// Sent is when the claim was sent (Claimer.Claim): the lease's start.
	Sent time.Time
	// Tx is the transaction that holds the claim (TxStore.ClaimTx); nil in the
	// default mode.
	Tx Tx
}

// Outcome is what the caller decided once its function returned: release the
// claim (the next request runs again), or complete it with Response.
type Outcome struct {
	Release  bool
	Response store.Response
}

// Ending is how Run ended an execution.
type Ending struct {
	// InTx: the caller completed the record in its own transaction
	// (MarkCompleted) with TxResponse; nothing else was called.
	InTx       bool
	TxResponse store.Response
	// Released: the claim was released (by Outcome, or during the execution), or
	// in the transaction mode rolled back.
	Released bool
	// Pending: the release or completion did not answer within the answer grace
	// and goes on in the background (a completion is then retried while the
	// lease is held, package documentation).
	Pending bool
	// RecordAlone: in the transaction mode, an aborted transaction was rolled
	// back and the record committed on its own (TxRecordAlone).
	RecordAlone bool
	// LeaseLost: a renewal found the lease taken over; the result was neither
	// completed nor released (Err is store.ErrLeaseLost).
	LeaseLost bool
	// Err is the completion's or the release's error (nil while Pending).
	Err error
	// StoreTime is how long the caller waited for the store after its function.
	StoreTime time.Duration
}

// Run executes the claim c from the store's answer to its end: it starts the
// execution (lease renewals, none in the transaction mode, whose transaction
// holds the key), runs fn, then ends the claim as fn's Outcome says: completes
// or releases it, or in the transaction mode commits the record with the
// caller's statements or rolls them back. The caller has set its context for fn
// (Context.Set or SetDetached with c.Claim and e) and values is the context
// whose values the store calls keep (not its cancellation); lost as in Start.
//
// In the default mode the caller's answer waits for the completion or the
// release at most the answer grace (1 s; store.InProcess stores, and calls
// whose own bound is no longer, are waited for): past it the call goes on in the background (Ending.Pending). In
// the transaction mode the answer depends on the commit, which runs on the
// caller's path under the completion deadline.
//
// When fn panics (or calls runtime.Goexit), Run releases the claim (rolls the
// transaction back), unless the record was completed in the caller's own
// transaction, and lets the panic go on; Ending then returns what it did.
func (e *Execution) Run(cl *Claimer, values context.Context, c Claimed, lost func(error), fn func() Outcome) Ending {
	e.tx = c.Tx
	e.Start(cl, values, c.Claim.ID, c.Claim.Token, c.Sent, lost)
	returned := false
	defer func() {
		if !returned {
			e.Stop()
			e.end = e.finish(Outcome{Release: true})
		}
	}()
	out := fn()
	returned = true
	e.returnedRun() // renewals go on until the completion ends (or Stop below)
	e.end = e.finish(out)
	return e.end
}

// Ending returns how Run ended the execution (for a caller whose function
// panicked).
func (e *Execution) Ending() Ending { return e.end }

// finish ends the claim as out says, once the execution has returned. The
// renewals stop here, except while a completion is pending (Complete).
func (e *Execution) finish(out Outcome) (end Ending) {
	t0 := time.Now()
	defer func() { end.StoreTime = time.Since(t0) }()
	if out.Release || e.released || e.tx != nil || e.LeaseLost() {
		e.Stop()
	}
	if end.InTx, end.TxResponse = e.Returned(); end.InTx {
		e.Stop()
		// Completed in the caller's own transaction, which committed: a cache in
		// front of the store is told, best effort.
		e.NotifyCompleted(end.TxResponse)
		return end
	}
	if e.tx != nil {
		return e.finishTx(out)
	}
	if e.LeaseLost() && !out.Release && !e.released {
		// Another holder runs now: its claim is neither completed nor released by
		// this one (the store would refuse either, fenced by the token).
		end.LeaseLost, end.Err = true, store.ErrLeaseLost
		return end
	}
	if out.Release || e.released {
		end.Released = true
		if e.released { // released during the execution (a hijack)
			end.Err = e.releaseErr
			return end
		}
		if !e.cl.inBackground(e.cl.cfg.Timeouts.Release) {
			end.Err = e.Release()
			return end
		}
		var err error
		end.Pending = !e.cl.await(func() { err = e.Release() }, nil) // a failure is logged by Release
		if !end.Pending {
			end.Err = err
		}
		return end
	}
	if !e.cl.inBackground(e.cl.cfg.Timeouts.Complete) {
		end.Pending, end.Err = e.Complete(out.Response)
		return end
	}
	var pending bool
	var err error
	if !e.cl.await(func() { pending, err = e.Complete(out.Response) }, func() {
		// The caller has answered: nobody else learns of a completion that failed
		// for good (one still pending is logged by completeLater).
		if err != nil && !pending {
			e.cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn,
				"idempotency completion failed after the answer was sent; the response was not stored (the next request runs again, or meets another holder's claim)",
				slog.String("scope", e.id.Scope), slog.String("key", e.id.Key), slog.Any("error", err))
		}
	}) {
		end.Pending = true
		return end
	}
	end.Pending, end.Err = pending, err
	return end
}

// finishTx commits the record with the caller's statements, or rolls them back.
func (e *Execution) finishTx(out Outcome) (end Ending) {
	cl := e.cl
	if out.Release || e.released {
		end.Released = true
		end.Err = e.Release() // rolls the transaction back, once
		return end
	}
	e.released = true // the commit ends the transaction: nothing is left to release
	ctx, cancel := cl.Bound(&e.ctx, cl.cfg.Timeouts.Complete)
	ctx, d := cl.observe(ctx, OpComplete, e.id)
	how, err := e.tx.Commit(ctx, out.Response, e.recordRetention())
	cancel()
	done(d, err)
	end.Err = err
	attrs := []slog.Attr{slog.String("scope", e.id.Scope), slog.String("key", e.id.Key), slog.Int("status", out.Response.Status)}
	switch {
	case err == nil && how == TxRecordAlone:
		end.RecordAlone = true
		cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn,
			"idempotency: a failed statement aborted the handler's transaction; its statements were rolled back and its response is stored on its own",
			attrs...)
	case err == nil:
		if n, ok := cl.cfg.Store.(store.CompletionNotifier); ok {
			nctx, cancel := cl.Bound(&e.ctx, cl.cfg.Timeouts.Complete)
			n.NotifyCompleted(nctx, e.id, e.token, out.Response, e.recordRetention())
			cancel()
		}
	case errors.Is(err, ErrTxEnded):
		cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelError,
			"idempotency: the handler ended or left its transaction; what committed is unknown, so the client gets 503 and the key stays claimed until its lease ends",
			append(attrs, slog.Any("error", err))...)
	case errors.Is(err, store.ErrLeaseLost):
		cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn,
			"idempotency: the server refused the record (the transaction no longer held the key); nothing committed",
			append(attrs, slog.Any("error", err))...)
	default:
		cl.cfg.Logger.LogAttrs(context.Background(), slog.LevelError,
			"idempotency: the handler's transaction did not commit, or its outcome is unknown; the client gets 503",
			append(attrs, slog.Any("error", err))...)
	}
	return end
}

// inBackground reports whether a store call bounded by bound may go on in the
// background past the answer grace (await): not for a store that never waits on
// I/O (store.InProcess), nor for a bound no longer than the grace (then the call
// itself ends within it).
func (cl *Claimer) inBackground(bound time.Duration) bool {
	return cl.bounded && bound > answerGrace
}

// await runs f and waits for it at most the answer grace; false when it goes on
// in the background (counted for Wait): then late, if not nil, runs after f, in
// its goroutine (the caller no longer reads what f wrote).
func (cl *Claimer) await(f, late func()) bool {
	var state atomic.Int32 // 1: f returned first; 2: the caller left first
	ch := make(chan struct{})
	cl.work.add()
	go func() {
		defer cl.work.done()
		defer close(ch)
		f()
		if !state.CompareAndSwap(0, 1) && late != nil {
			late()
		}
	}()
	select {
	case <-ch:
		return true
	default:
	}
	t := time.NewTimer(answerGrace)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
		if state.CompareAndSwap(0, 2) {
			return false
		}
		<-ch // f returned as the grace ended: its results are the caller's
	}
	return true
}
