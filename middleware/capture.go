package middleware

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/store"
)

// maxPooledBuffer bounds the capacity of the buffers kept in the pool (bytes).
const maxPooledBuffer = 64 << 10

// call is the state of one claimed execution; pooled. It is the
// http.ResponseWriter the handler sees: writes go to the live writer first and
// are copied once into body until the storage cap is passed.
type call struct {
	m     *Middleware
	w     http.ResponseWriter
	id    store.ID
	token store.Token
	ctx   detachedCtx
	route string // the fingerprint's route, for the handler duration estimate

	// Response capture.
	wroteHeader bool
	status      int
	hijacked    bool
	omitted     bool
	writeFailed bool  // a live Write or Flush failed (client gone, deadline passed)
	written     int64 // body bytes the handler wrote
	declared    int64 // the Content-Length the handler set at commit, -1 if none
	body        []byte
	header      http.Header // replayable headers, snapshot when the status was committed
	pre         []string    // header names present before the handler ran

	// Request body, read once.
	reqBuf  []byte
	reqBody requestBody

	// In-transaction completion (MarkCompleted), guarded by txMu: the handler may
	// call it while a renewal holds mu.
	txMu      sync.Mutex
	returned  bool // the handler returned; MarkCompleted is refused
	inTx      bool
	txResp    store.Response
	retention time.Duration // SetRetention's; 0: the middleware's

	// Release before the client can retry: a response the claim will be released
	// for is held back (status, body) until the release is done.
	holding        bool
	released       bool
	releaseErr     error
	releaseLatency time.Duration

	// Lease renewal.
	renewLost atomic.Bool  // a renewal found the lease lost
	held      atomic.Int64 // when the lease was last known held: m.epoch + held (claim or renewal)
	mu        sync.Mutex
	stopped   bool
	timer     Timer
	renewFn   func()
}

// detachedCtx keeps the request context's values but not its cancellation, so
// Complete and Release still reach the store when the client has gone. A store
// may keep a context past its call (pgxpool finishes a dial in the background
// with the caller's values): parent is guarded, since the pooled call sets it for
// the next request; a context kept that long sees no values, or the next
// request's.
type detachedCtx struct {
	mu     sync.Mutex
	parent context.Context
}

func (d *detachedCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (d *detachedCtx) Done() <-chan struct{}       { return nil }
func (d *detachedCtx) Err() error                  { return nil }
func (d *detachedCtx) Value(k any) any {
	d.mu.Lock()
	p := d.parent
	d.mu.Unlock()
	if p == nil { // a store kept the context past its call
		return nil
	}
	return p.Value(k)
}

func (d *detachedCtx) set(parent context.Context) {
	d.mu.Lock()
	d.parent = parent
	d.mu.Unlock()
}

// start readies c for the handler; held is when the claim was known held
// (time since m.epoch).
func (c *call) start(w http.ResponseWriter, ctx context.Context, id store.ID, token store.Token, held time.Duration) {
	c.w = w
	c.ctx.set(ctx)
	c.txMu.Lock() // a late MarkCompleted from a goroutine the handler left behind reads them
	c.id, c.token = id, token
	c.txMu.Unlock()
	c.held.Store(int64(held))
	c.mu.Lock()
	c.stopped = false
	if c.timer == nil {
		c.timer = c.m.clock.AfterFunc(c.m.lease/3, c.renewFn)
	} else {
		c.timer.Reset(c.m.lease / 3)
	}
	c.mu.Unlock()
}

// renew runs on the clock's goroutine every third of the lease until stopped.
func (c *call) renew() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	at := time.Since(c.m.epoch)
	ctx, cancel := c.m.storeCtx(&c.ctx, c.m.timeouts.Renew)
	err := c.m.store.Renew(ctx, c.id, c.token, c.m.lease)
	cancel()
	switch {
	case err == nil:
		c.held.Store(int64(at))
	case errors.Is(err, store.ErrLeaseLost):
		// Logged when the handler returns: a record the handler completed in its own
		// transaction also ends the lease, and is no loss.
		c.renewLost.Store(true)
		return // nothing left to renew
	case err != nil:
		c.m.logger.LogAttrs(context.Background(), slog.LevelWarn, "idempotency lease renewal failed; retrying",
			slog.String("scope", c.id.Scope), slog.String("key", c.id.Key), slog.Any("error", err))
	}
	c.timer.Reset(c.m.lease / 3)
}

// handlerReturned closes the window of MarkCompleted and reports whether the
// handler completed the record in its own transaction.
func (c *call) handlerReturned() (inTx bool) {
	c.txMu.Lock()
	defer c.txMu.Unlock()
	c.returned = true
	return c.inTx
}

// completedInTx reports whether the handler called MarkCompleted.
func (c *call) completedInTx() bool {
	c.txMu.Lock()
	defer c.txMu.Unlock()
	return c.inTx
}

// heldAt returns when the lease was last known held (claim or renewal sent then
// succeeded), on the monotonic clock.
func (c *call) heldAt() time.Time { return c.m.epoch.Add(time.Duration(c.held.Load())) }

// restartRenewal schedules renewals again after stopRenewal.
func (c *call) restartRenewal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = false
	c.timer.Reset(c.m.lease / 3)
}

// releaseNow releases the claim once (token-checked), recording the result;
// never after MarkCompleted, whose record is committed.
func (c *call) releaseNow() {
	if c.released || c.completedInTx() {
		return
	}
	c.released = true
	t0 := c.m.now()
	ctx, cancel := c.m.storeCtx(&c.ctx, c.m.timeouts.Release)
	ctx, done := c.m.storeCall(ctx, StoreRelease, c.id)
	c.releaseErr = c.m.store.Release(ctx, c.id, c.token)
	cancel()
	storeDone(done, c.releaseErr)
	c.releaseLatency = c.m.since(t0)
	if c.releaseErr != nil {
		c.m.logRelease(c, c.releaseErr)
	}
}

// unhold sends a held response to the client: status, then the buffered body;
// nothing once the connection was hijacked (the handler answered on it).
func (c *call) unhold() {
	if !c.holding {
		return
	}
	c.holding = false
	if c.hijacked {
		return
	}
	c.w.WriteHeader(c.status)
	if len(c.body) > 0 {
		if _, err := c.w.Write(c.body); err != nil && !errors.Is(err, http.ErrBodyNotAllowed) {
			c.writeFailed = true
		}
	}
}

// stopRenewal stops the renewals and waits for one in progress. It reports
// whether c may be reused: false when a renewal had fired but not yet run, since
// it will still look at c.
func (c *call) stopRenewal() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	return c.timer.Stop()
}

// resetUnstarted readies c for the pool when start never ran: only the claim's
// context and the request body were set.
func (c *call) resetUnstarted() {
	c.ctx.set(nil)
	c.resetRequestBody()
}

// resetRequestBody drops the request body, keeping a buffer of at most
// maxPooledBuffer bytes.
func (c *call) resetRequestBody() {
	if cap(c.reqBuf) > maxPooledBuffer {
		c.reqBuf = nil
	}
	c.reqBuf = c.reqBuf[:0]
	c.reqBody.Reset(nil)
}

// reset readies c for the pool.
func (c *call) reset() {
	c.w, c.route = nil, ""
	c.ctx.set(nil)
	c.wroteHeader, c.status, c.hijacked, c.omitted = false, 0, false, false
	c.writeFailed, c.written, c.declared = false, 0, 0
	c.holding, c.released, c.releaseErr, c.releaseLatency = false, false, nil, 0
	c.txMu.Lock()
	c.id, c.token = store.ID{}, store.Token{}
	c.returned, c.inTx, c.txResp, c.retention = false, false, store.Response{}, 0
	c.txMu.Unlock()
	c.renewLost.Store(false)
	if cap(c.body) > maxPooledBuffer {
		c.body = nil
	}
	c.body = c.body[:0]
	clear(c.header)
	clear(c.pre)
	c.pre = c.pre[:0]
	c.resetRequestBody()
}

// commit records the final status and snapshots the replayable headers, as the
// live response commits them.
func (c *call) commit(code int) {
	c.wroteHeader, c.status = true, code
	h := c.w.Header()
	c.declared = -1
	var connection []string
	for k, v := range h { // one walk, no lookups: most headers are a handful
		switch k {
		case "Content-Length":
			if len(v) == 1 {
				if n, err := strconv.ParseInt(v[0], 10, 64); err == nil && n >= 0 {
					c.declared = n
				}
			}
		case "Connection":
			connection = v
		}
		if c.m.replayable(k, c.pre) {
			c.header[k] = v
		}
	}
	if len(connection) > 0 && c.m.allow == nil {
		for k := range c.header {
			if namedBy(connection, k) {
				delete(c.header, k) // hop-by-hop
			}
		}
	}
}

// Header returns the live response's header map.
func (c *call) Header() http.Header { return c.w.Header() }

// WriteHeader passes code on; the first final (non-1xx) status is the one stored.
// A status the claim will be released for (the release policy) is held back with
// its body until the claim is released, so a client that gets it and retries at
// once never meets the dead claim (409); a 101 releases before it is sent.
func (c *call) WriteHeader(code int) {
	if c.wroteHeader || (code >= 100 && code < 200 && code != http.StatusSwitchingProtocols) {
		if !c.holding {
			c.w.WriteHeader(code)
		}
		return
	}
	c.begin(code)
}

// begin commits the first final status: held back when the claim will be
// released for it, passed on otherwise.
func (c *call) begin(code int) {
	switch {
	case code == http.StatusSwitchingProtocols:
		c.releaseNow()
	case code >= 200 && code <= 999 && c.m.release(code):
		c.commit(code)
		c.holding = true
		return
	}
	c.w.WriteHeader(code) // may panic on an invalid code: then nothing is recorded
	c.commit(code)
}

// Write passes p to the live response and copies it into the capture buffer
// until the storage cap is passed; past it the record keeps no body. The record
// keeps what the handler wrote even when the live write fails (one client gone
// must not truncate the answer every retry gets), except a body the status does
// not allow (http.ErrBodyNotAllowed), which no client ever sees.
func (c *call) Write(p []byte) (int, error) {
	if !c.wroteHeader {
		c.begin(http.StatusOK)
	}
	if c.holding {
		if len(c.body)+len(p) <= c.m.maxStoredBody {
			c.body = append(c.body, p...)
			c.written += int64(len(p))
			return len(p), nil
		}
		// Too large to hold: release now and stream the rest.
		c.releaseNow()
		c.unhold()
	}
	n, err := c.w.Write(p)
	if err != nil {
		if errors.Is(err, http.ErrBodyNotAllowed) {
			return n, err
		}
		c.writeFailed = true
	}
	c.written += int64(len(p))
	if !c.omitted {
		if len(c.body)+len(p) > c.m.maxStoredBody {
			c.omitted = true
			c.body = c.body[:0]
		} else {
			c.body = append(c.body, p...)
		}
	}
	return n, err
}

// Flush flushes the live response (http.Flusher).
func (c *call) Flush() { _ = c.FlushError() }

// FlushError flushes the live response and reports failure; http.ResponseController
// uses it.
func (c *call) FlushError() error {
	if !c.wroteHeader {
		c.begin(http.StatusOK)
	}
	if c.holding {
		return nil // sent once the claim is released
	}
	err := http.NewResponseController(c.w).Flush()
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		c.writeFailed = true
	}
	return err
}

// incomplete reports whether the captured response is known to be cut short, so
// it must not be stored: the handler set a Content-Length its body does not
// match, or it returned after its client went away (request context done)
// having written nothing or having seen a live write fail. wroteNothing is
// whether the handler returned without committing a status.
func (c *call) incomplete(ctx context.Context, wroteNothing bool) bool {
	if c.declared >= 0 && c.written != c.declared && bodyAllowed(c.status) {
		return true
	}
	return ctx.Err() != nil && (wroteNothing || c.writeFailed)
}

// bodyAllowed reports whether a response with status may carry a body (RFC 9110
// sections 15.2, 15.3.5, 15.4.5).
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// Hijack hands the connection over (http.Hijacker); the claim is released before
// the handler gets it, as the response is not known and the handler may answer on
// the connection. A hijack that fails (say, on HTTP/2) releases nothing: the
// handler's answer is then stored as any other. When the handler already sent a
// status (which hijacking flushes to the client), the claim is released first.
func (c *call) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if c.wroteHeader && !c.holding {
		c.releaseNow()
	}
	conn, rw, err := http.NewResponseController(c.w).Hijack()
	if err == nil {
		c.releaseNow()
		c.hijacked = true
	}
	return conn, rw, err
}

// Unwrap returns the live ResponseWriter, so http.ResponseController reaches its
// deadlines and full-duplex controls.
func (c *call) Unwrap() http.ResponseWriter { return c.w }
