package middleware

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
)

// execute runs the handler under the claim a answered (claim.Execution.Run:
// start, renewals, the handler, then completion or release, or in the
// one-transaction mode the commit or the rollback), and answers the client:
// the response it streamed, or the response it held (a released status, or
// every status in the one-transaction mode) once the claim's end is known; a
// 503 store_unavailable instead when the one-transaction commit failed.
func (m *Middleware) execute(x *execution, r *http.Request, next http.Handler, cl claim.Claim, a *answer) {
	if h := x.w.Header(); len(h) > 0 {
		for k := range h {
			x.pre = append(x.pre, k) // set by outer middleware: not the handler's to replay
		}
	}
	ev := Event{ID: a.id, Takeover: a.res.Takeover, Waited: a.waited}
	returned := false
	defer func() {
		if !returned {
			m.panicked(x, r, ev, a.latency)
		}
	}()
	var began time.Time // the handler's start on a caller's clock (WithClock with Now)
	if !m.monoClock {
		began = m.clockNow()
	}
	end := x.exec.Run(m.claimer, r.Context(), claim.Claimed{Claim: cl, Sent: a.sent, Tx: a.tx}, x.cancelLost, func() claim.Outcome {
		next.ServeHTTP(x, r)
		m.work.observe(x.route, m.handlerTime(a.sent, began))
		return m.outcome(x, r, next)
	})
	returned = true
	ev.Status = x.status
	switch {
	case end.InTx:
		// The handler completed the record in its own transaction (MarkCompleted):
		// the store already holds it; a cache in front of it was told.
		ev.Decision, ev.InTransaction = Executed, true
	case end.Released:
		if x.hijacked {
			ev.Status = 0
		}
		ev.Decision, ev.Err = Released, end.Err
		if x.releaseErr != nil {
			ev.Err = x.releaseErr
		}
	default:
		m.completed(x, r, &ev, end)
	}
	x.unhold() // a held response goes out once the claim's end is known
	if m.observer != nil {
		ev.StoreLatency = a.latency + end.StoreTime + x.releaseLatency
	}
	if !end.Pending { // no completion reads the buffers any more
		clear(x.header)
		x.bufs.body, x.bufs.header = x.body, x.header
	}
	m.observe(r.Context(), ev)
}

// outcome decides, once the handler returned, whether its response is stored
// or the claim released: released for a status the release rule names, a
// hijacked connection or a 101, a response known to be cut short, or the
// router's own answer (Unrouted).
func (m *Middleware) outcome(x *execution, r *http.Request, next http.Handler) claim.Outcome {
	wroteNothing := !x.wroteHeader
	if wroteNothing {
		x.commit(http.StatusOK) // net/http sends 200 for a handler that wrote nothing
		x.holding = x.tx        // sent once the commit decided
	}
	if x.exec.Released() || x.hijacked || x.status == http.StatusSwitchingProtocols || m.release(x.status) ||
		x.incomplete(r.Context(), wroteNothing) || m.unrouted(next, r, x) {
		return claim.Outcome{Release: true}
	}
	if x.exec.LeaseLost() {
		id := x.exec.ID()
		m.logger.LogAttrs(r.Context(), slog.LevelWarn,
			"idempotency lease lost while the handler ran; its response will not be stored",
			slog.String("scope", id.Scope), slog.String("key", id.Key))
	}
	resp := store.Response{Status: x.status, Header: x.header, Body: x.body, BodyOmitted: x.omitted}
	if x.omitted {
		resp.Body = nil
	}
	if len(resp.Header) == 0 {
		resp.Header = nil
	}
	return claim.Outcome{Response: resp}
}

// completed fills ev in for a response the execution stored (or tried to):
// completion pending in the background (logged by package claim), the lease
// lost, a store refusal; in the one-transaction mode a commit that failed turns
// the held response into 503 store_unavailable, the configured problem.
func (m *Middleware) completed(x *execution, r *http.Request, ev *Event, end claim.Ending) {
	id := x.exec.ID()
	ev.Decision, ev.CompletionPending, ev.Err = Executed, end.Pending, end.Err
	err := end.Err
	if x.tx && err != nil {
		m.unavailable(x)
		ev.Status = http.StatusServiceUnavailable
		ev.Decision = StoreError
		if errors.Is(err, store.ErrLeaseLost) {
			ev.Decision = LeaseLost
		}
		return
	}
	switch {
	case end.Pending: // logged by package claim, at the attempt and at the end
	case errors.Is(err, store.ErrLeaseLost):
		ev.Decision = LeaseLost
		m.logger.LogAttrs(r.Context(), slog.LevelWarn,
			"idempotency lease lost before completion: this claim's token no longer holds the key (its lease expired and another request may have claimed it, or the key was released, evicted or expired); the response was not stored",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Int("status", x.status))
	case err != nil:
		m.logger.LogAttrs(r.Context(), slog.LevelError, "idempotency store refused the completion; the key stays claimed until its lease expires",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
	}
}

// unavailable replaces a held response with 503 store_unavailable (the
// configured problem, with Retry-After): the one-transaction commit failed, so
// the handler's rows may not exist. The handler's headers are dropped.
func (m *Middleware) unavailable(x *execution) {
	x.holding = false
	h := x.w.Header()
	for k := range h {
		if !contains(x.pre, k) {
			delete(h, k)
		}
	}
	m.writeProblem(x.w, x.bufs, http.StatusServiceUnavailable, m.problems.storeDown, max(m.storeRetryAfter, 1))
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// handlerTime returns the duration of a handler that just returned, for the
// estimate behind a 409's Retry-After: from the claim's send, on the monotonic
// clock (the estimate counts the claim's answer too, and reads no clock before
// the handler), or from began on a caller's clock (WithClock with Now).
func (m *Middleware) handlerTime(sent, began time.Time) time.Duration {
	if m.monoClock {
		return time.Since(sent)
	}
	return m.clockNow().Sub(began)
}

// panicked observes an execution whose handler panicked (or called
// runtime.Goexit), which claim.Execution.Run ended (released, or kept the record
// the handler completed in its own transaction), then re-panics. A held
// response (see execution.begin) is never sent.
func (m *Middleware) panicked(x *execution, r *http.Request, ev Event, latency time.Duration) {
	p := recover()
	end := x.exec.Ending()
	ev.Status = x.status
	if end.InTx {
		ev.Decision, ev.InTransaction = Executed, true
	} else {
		ev.Decision, ev.Err = Released, end.Err
	}
	if m.observer != nil {
		ev.StoreLatency = latency + end.StoreTime
	}
	m.observe(r.Context(), ev)
	if p != nil {
		panic(p)
	}
}
