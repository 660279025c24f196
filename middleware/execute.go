package middleware

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/store"
)

// execute runs the handler under the claim a answered, then completes or
// releases it. It reports whether c may go back to the pool.
func (m *Middleware) execute(c *call, w http.ResponseWriter, r *http.Request, next http.Handler, a *answer) (reusable bool) {
	c.start(w, r.Context(), a.id, a.res.Token, a.sent)
	if h := w.Header(); len(h) > 0 {
		for k := range h {
			c.pre = append(c.pre, k) // set by outer middleware: not the handler's to replay
		}
	}
	ev := Event{ID: a.id, Takeover: a.res.Takeover, Waited: a.waited}
	returned := false
	defer func() {
		if !returned {
			m.panicked(c, r, ev, a.latency)
		}
	}()
	var began time.Time // the handler's start on a caller's clock (WithClock with Now)
	if !m.monoClock {
		began = m.clockNow()
	}
	next.ServeHTTP(c, r)
	returned = true
	inTx, txResp := c.exec.Returned()
	m.work.observe(c.route, m.handlerTime(a.sent, began))
	reusable = c.exec.Stop()

	wroteNothing := !c.wroteHeader
	if wroteNothing {
		c.commit(http.StatusOK) // net/http sends 200 for a handler that wrote nothing
	}
	ev.Status = c.status
	switch {
	case inTx:
		// The handler completed the record in its own transaction (MarkCompleted):
		// the store already holds it; a cache in front of it is told, best effort.
		ev.Decision, ev.InTransaction = Executed, true
		ev.StoreLatency = m.notifyCompleted(c, txResp)
		c.unhold()
	case c.exec.Released() || c.hijacked || c.status == http.StatusSwitchingProtocols || m.release(c.status) ||
		c.incomplete(r.Context(), wroteNothing) || m.unrouted(next, r, c):
		if c.hijacked {
			ev.Status = 0
		}
		ev.Decision = Released
		c.releaseNow() // before a held response's first byte reaches the client
		ev.Err, ev.StoreLatency = c.releaseErr, c.releaseLatency
		c.unhold()
	default:
		if !m.storeResponse(c, r, &ev) {
			reusable = false // the background completion still looks at c
		}
	}
	ev.StoreLatency += a.latency
	m.observe(r.Context(), ev)
	return reusable
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

// panicked ends an execution whose handler panicked (or called
// runtime.Goexit): release, then re-panic. A held response (see call.hold) is
// never sent. A record the handler completed in its own transaction before it
// panicked (MarkCompleted) is committed: not released, and a cache in front of
// the store is told.
func (m *Middleware) panicked(c *call, r *http.Request, ev Event, latency time.Duration) {
	p := recover()
	inTx, txResp := c.exec.Returned()
	c.exec.Stop()
	ev.Status = c.status
	if inTx {
		ev.Decision, ev.InTransaction = Executed, true
		ev.StoreLatency = latency + m.notifyCompleted(c, txResp)
	} else {
		ev.Decision = Released
		c.releaseNow()
		ev.Err = c.releaseErr
		ev.StoreLatency = latency + c.releaseLatency
	}
	m.observe(r.Context(), ev)
	if p != nil {
		panic(p)
	}
}

// storeResponse completes the record with the captured response and fills ev
// in: one attempt on the request's path (claim.Execution.Complete); when it
// fails while the lease is held, completion goes on in the background (ev says
// so, and its end is logged) and the answer goes to the client at once. It
// reports whether c may be reused: not while that work still looks at it.
func (m *Middleware) storeResponse(c *call, r *http.Request, ev *Event) (reusable bool) {
	id := c.exec.ID()
	ev.Decision = Executed
	if c.exec.LeaseLost() {
		m.logger.LogAttrs(r.Context(), slog.LevelWarn,
			"idempotency lease lost while the handler ran; its response will not be stored",
			slog.String("scope", id.Scope), slog.String("key", id.Key))
	}
	resp := store.Response{Status: c.status, Header: c.header, Body: c.body, BodyOmitted: c.omitted}
	if c.omitted {
		resp.Body = nil
	}
	if len(resp.Header) == 0 {
		resp.Header = nil
	}
	t0 := m.now()
	ev.CompletionPending, ev.Err = c.exec.Complete(resp)
	ev.StoreLatency = m.since(t0)
	switch err := ev.Err; {
	case ev.CompletionPending: // logged by package claim, at the attempt and at the end
	case errors.Is(err, store.ErrLeaseLost):
		ev.Decision = LeaseLost
		m.logger.LogAttrs(r.Context(), slog.LevelWarn,
			"idempotency lease lost before completion: this claim's token no longer holds the key (its lease expired and another request may have claimed it, or the key was released, evicted or expired); the response was not stored",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Int("status", c.status))
	case err != nil:
		m.logger.LogAttrs(r.Context(), slog.LevelError, "idempotency store refused the completion; the key stays claimed until its lease expires",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
	}
	return !ev.CompletionPending
}

// notifyCompleted tells a store that keeps a copy of records (store.CompletionNotifier)
// that the handler completed c's record in its own transaction with resp, best
// effort, and returns the time it took (0 without an observer).
func (m *Middleware) notifyCompleted(c *call, resp store.Response) time.Duration {
	t0 := m.now()
	c.exec.NotifyCompleted(resp)
	return m.since(t0)
}
