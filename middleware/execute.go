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
func (m *Middleware) execute(c *call, w http.ResponseWriter, r *http.Request, next http.Handler, a answer) (reusable bool) {
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
	began := a.sent // the claim's send time: the estimate counts its answer too, and reads no clock here
	if !m.monoClock {
		began = m.clockNow()
	}
	next.ServeHTTP(c, r)
	returned = true
	inTx, txResp := c.exec.Returned()
	m.work.observe(c.route, m.clockNow().Sub(began))
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
			reusable = false // a renewal restarted for the retries may still look at c
		}
	}
	ev.StoreLatency += a.latency
	m.observe(r.Context(), ev)
	return reusable
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

// storeResponse completes the record with the captured response (retried while the
// lease is held, see complete) and fills ev in. It reports whether the renewals
// are known stopped (c may be reused).
func (m *Middleware) storeResponse(c *call, r *http.Request, ev *Event) (stopped bool) {
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
	var again bool
	ev.Err, ev.CompleteRetries, again, stopped = m.complete(c, resp)
	ev.StoreLatency = m.since(t0)
	switch err := ev.Err; {
	case errors.Is(err, store.ErrLeaseLost):
		ev.Decision = LeaseLost
		m.logger.LogAttrs(r.Context(), slog.LevelWarn,
			"idempotency lease lost before completion; the response was not stored (another request took the key over)",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Int("status", c.status))
	case err != nil:
		m.logger.LogAttrs(r.Context(), slog.LevelError, "idempotency store failed to complete; the key stays claimed until its lease expires",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Int("retries", ev.CompleteRetries), slog.Any("error", err))
	case again:
		m.logger.LogAttrs(r.Context(), slog.LevelInfo, "idempotency record completed after retries",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Int("retries", ev.CompleteRetries))
	}
	return stopped
}

// notifyCompleted tells a store that keeps a copy of records (store.CompletionNotifier)
// that the handler completed c's record in its own transaction with resp, best
// effort, and returns the time it took (0 without an observer).
func (m *Middleware) notifyCompleted(c *call, resp store.Response) time.Duration {
	t0 := m.now()
	c.exec.NotifyCompleted(resp)
	return m.since(t0)
}

// complete stores resp (claim.Execution.Complete: retried with back-off while the
// lease is held, for at most one lease; duplicates get 409 meanwhile). The
// response is flushed to the client before the first retry. It returns the last
// error, the number of retries, whether a retry succeeded, and whether the
// renewals restarted for the retries are known stopped (c may be reused).
func (m *Middleware) complete(c *call, resp store.Response) (err error, retries int, again, stopped bool) {
	retries, stopped, err = c.exec.Complete(resp, func() {
		_ = http.NewResponseController(c.w).Flush() // the client need not wait for the store
	})
	return err, retries, err == nil && retries > 0, stopped
}
