package middleware

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkey/idemkey/claim"
)

// execution is one claimed request's execution, allocated per claimed request
// (a goroutine the handler leaves behind may keep any of it): the handler's
// request and context, the claim's execution (package claim), and the
// http.ResponseWriter the handler sees, whose writes go to the live writer
// first and are copied once into body until the storage cap is passed. In the
// one-transaction mode (tx) every response is held until the commit decides
// it. Only its byte buffers come from the pool (call).
type execution struct {
	hr    handlerReq // the handler's request and its context
	m     *Middleware
	w     http.ResponseWriter
	bufs  *call           // the pooled buffers: the capture buffer comes from it
	exec  claim.Execution // the claim's renewal, completion, release (claim.Execution.Run)
	route string          // the fingerprint's route, for the handler duration estimate
	tx    bool            // the one-transaction mode: hold every response until the commit
	// cancelLost cancels the handler's context with cause store.ErrLeaseLost when
	// a renewal finds the lease taken over.
	cancelLost context.CancelCauseFunc

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

	// Release before the client can retry: a response the claim will be released
	// for is held back (status, body) until the release is done.
	holding        bool
	releaseErr     error
	releaseLatency time.Duration
}

// releaseNow releases the claim once (token-checked), recording the result;
// never after MarkCompleted, whose record is committed.
func (c *execution) releaseNow() {
	if c.exec.Released() {
		return
	}
	t0 := c.m.now()
	c.releaseErr = c.exec.Release()
	c.releaseLatency = c.m.since(t0)
}

// unhold sends a held response to the client: status, then the buffered body;
// nothing once the connection was hijacked (the handler answered on it).
func (c *execution) unhold() {
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

// commit records the final status and snapshots the replayable headers, as the
// live response commits them.
func (c *execution) commit(code int) {
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
func (c *execution) Header() http.Header { return c.w.Header() }

// WriteHeader passes code on; the first final (non-1xx) status is the one stored.
// A status the claim will be released for (the release rule) is held back with
// its body until the claim is released, so a client that gets it and retries at
// once never meets the dead claim (409); a 101 releases before it is sent.
func (c *execution) WriteHeader(code int) {
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
func (c *execution) begin(code int) {
	switch {
	case code == http.StatusSwitchingProtocols:
		c.releaseNow()
	case code >= 200 && code <= 999 && (c.tx || c.m.release(code)):
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
func (c *execution) Write(p []byte) (int, error) {
	if !c.wroteHeader {
		c.begin(http.StatusOK)
	}
	if c.holding && c.tx { // held until the commit, whatever its size
		c.body = append(c.body, p...)
		c.written += int64(len(p))
		c.omitted = c.omitted || len(c.body) > c.m.maxStoredBody
		return len(p), nil
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
func (c *execution) Flush() { _ = c.FlushError() }

// FlushError flushes the live response and reports failure; http.ResponseController
// uses it.
func (c *execution) FlushError() error {
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
func (c *execution) incomplete(ctx context.Context, wroteNothing bool) bool {
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
func (c *execution) Hijack() (net.Conn, *bufio.ReadWriter, error) {
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
func (c *execution) Unwrap() http.ResponseWriter { return c.w }

// replayable reports whether the response header k may be stored for replay,
// but for the headers a Connection header names (see namedBy), which are not
// stored either unless an allow list names them.
func (m *Middleware) replayable(k string, pre []string) bool {
	if m.denyLens>>min(len(k), 63)&1 != 0 { // no lookup for a length no denied name has
		if _, deny := m.deny[k]; deny {
			return false
		}
	}
	if m.allow != nil {
		_, ok := m.allow[k]
		return ok
	}
	if len(k) > 0 {
		switch k[0] | 0x20 { // the first letter of a denied prefix, either case
		case 'r', 'x':
			if hasPrefixFold(k, "Ratelimit") || hasPrefixFold(k, "X-Ratelimit") || hasPrefixFold(k, "X-Rate-Limit") {
				return false
			}
		case 't':
			if strings.HasPrefix(k, http.TrailerPrefix) {
				return false
			}
		}
	}
	for _, p := range pre {
		if p == k {
			return false
		}
	}
	return true
}

// namedBy reports whether the Connection header values connection name the
// header k: a hop-by-hop header (RFC 9110 section 7.6.1).
func namedBy(connection []string, k string) bool {
	for _, v := range connection {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), k) {
				return true
			}
		}
	}
	return false
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
