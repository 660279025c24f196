package middleware

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/store"
)

// This file follows a protected request in order: parse the key (serve,
// parseKey), fingerprint the request (readFingerprint), claim the key
// (claimKey), decide (decide: replay, 409, 422, or run), then execute.go runs
// the handler under the claim, capture.go captures its response, and execute.go
// completes or releases the claim.

// serve handles one request; tx selects the one-transaction mode (OneTx).
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, tx bool) {
	ctx := r.Context()
	if !m.protected(r.Method) {
		next.ServeHTTP(w, r)
		m.observe(ctx, Event{Decision: PassThrough})
		return
	}
	id, ok := m.parseKey(w, r, next)
	if !ok {
		return
	}
	c := m.pool.Get().(*call)
	defer m.putCall(c)
	body, route, fp, ok := m.readFingerprint(w, r, c, id)
	if !ok {
		return
	}
	a := m.claimKey(ctx, id, fp, tx)
	m.claimAsV1(ctx, r, body, route, tx, &a) // a record stored before an upgrade
	if m.claimFailed(w, r, next, c, body, &a) {
		return
	}
	m.decide(w, r, next, c, body, route, fp, &a)
}

// call holds the byte buffers a request borrows from the pool: the request body
// read once, the header values of the middleware's own answers (headerValues),
// and the capture buffer an execution takes (execution.body), which comes back
// only when no completion still reads it.
type call struct {
	reqBuf []byte
	values []string
	body   []byte
	header http.Header // the captured headers: the execution takes it, as body
}

// maxPooledBuffer bounds the capacity of the buffers kept in the pool (bytes).
const maxPooledBuffer = 64 << 10

// putCall gives c's buffers back to the pool.
func (m *Middleware) putCall(c *call) {
	if cap(c.reqBuf) > maxPooledBuffer {
		c.reqBuf = nil
	}
	if cap(c.body) > maxPooledBuffer {
		c.body = nil
	}
	c.reqBuf, c.body = c.reqBuf[:0], c.body[:0]
	m.pool.Put(c)
}

// parseKey reads the key header: it answers the request itself (a pass-through
// without a key, 400 for a missing, invalid or too long key or scope) and
// returns false, or returns the request's scope and key.
func (m *Middleware) parseKey(w http.ResponseWriter, r *http.Request, next http.Handler) (store.ID, bool) {
	ctx := r.Context()
	values := r.Header[m.keyHeader]
	if len(values) == 0 {
		if !m.required {
			next.ServeHTTP(w, r)
			m.observe(ctx, Event{Decision: NoKey})
			return store.ID{}, false
		}
		m.writeProblem(w, nil, http.StatusBadRequest, m.problems.missing, 0)
		m.observe(ctx, Event{Decision: KeyMissing, Status: http.StatusBadRequest})
		return store.ID{}, false
	}
	var key string
	var err error
	if len(values) > 1 {
		err = keyError("sent in several header lines")
	} else {
		key, err = ParseKey(values[0])
	}
	if err != nil {
		m.writeProblem(w, nil, http.StatusBadRequest, problem{Title: "Invalid Idempotency-Key header",
			Status: http.StatusBadRequest, Code: CodeKeyInvalid,
			Detail: "The " + m.keyHeader + " header must be one Structured Field string (or a bare token) of 1 to 255 printable ASCII characters, not only spaces: " +
				strings.TrimPrefix(err.Error(), "idemkey/middleware: invalid idempotency key: ") + "."}.render(m.problemStyle()), 0)
		m.observe(ctx, Event{Decision: KeyInvalid, Status: http.StatusBadRequest})
		return store.ID{}, false
	}
	if m.keyValidator != nil {
		if err := m.keyValidator(key); err != nil {
			m.refuseKey(w, ctx, err)
			return store.ID{}, false
		}
	}
	id := store.ID{Scope: m.scope(r), Key: key}
	if len(id.Scope) > store.MaxScopeLen {
		m.writeProblem(w, nil, http.StatusBadRequest, m.problems.scopeProblem(id.Scope), 0)
		m.observe(ctx, Event{Decision: KeyInvalid, ID: id, Status: http.StatusBadRequest})
		return store.ID{}, false
	}
	return id, true
}

// readFingerprint reads the request body once (into c's buffer) and
// fingerprints the request, whose route it returns; a body too large (413) or
// unreadable (400) is answered here, and ok is false.
func (m *Middleware) readFingerprint(w http.ResponseWriter, r *http.Request, c *call, id store.ID) (body []byte, route string, fp store.Fingerprint, ok bool) {
	ctx := r.Context()
	body, err := fingerprint.ReadBody(r.Body, r.ContentLength, m.maxRequestBody, c.reqBuf)
	c.reqBuf = body[:0]
	if err != nil {
		if errors.Is(err, fingerprint.ErrBodyTooLarge) {
			m.writeProblem(w, c, http.StatusRequestEntityTooLarge, problem{Title: "Request body too large",
				Status: http.StatusRequestEntityTooLarge, Code: CodeRequestTooLarge,
				Detail: fmt.Sprintf("The request body is larger than %d bytes, the most this operation fingerprints.", m.maxRequestBody)}.render(m.problemStyle()), 0)
			m.observe(ctx, Event{Decision: BodyTooLarge, ID: id, Status: http.StatusRequestEntityTooLarge})
			return nil, "", fp, false
		}
		m.writeProblem(w, c, http.StatusBadRequest, problem{Title: "Request body unreadable",
			Status: http.StatusBadRequest, Code: CodeBodyUnreadable,
			Detail: "The request body could not be read completely."}.render(m.problemStyle()), 0)
		m.observe(ctx, Event{Decision: BodyUnreadable, ID: id, Status: http.StatusBadRequest, Err: err})
		return nil, "", fp, false
	}
	route = m.route(r)
	fp, err = m.sum(r, body, route, 0)
	if err != nil { // the rule cannot read the body: the client's mistake
		m.refuseBody(w, ctx, id, err)
		return nil, "", fp, false
	}
	return body, route, fp, true
}

// answer is the store's answer to a request's claim, and what it cost.
type answer struct {
	id      store.ID
	res     store.ClaimResult
	tx      claim.Tx  // the one-transaction mode: the transaction that holds the claim
	sent    time.Time // when the claim that answered was sent: the lease's start
	err     error
	latency time.Duration // store time (0 without an observer)
	waited  time.Duration // time waiting for a claim in flight (WithWaitInFlight)
}

// claimKey claims id (package claim bounds the call), in a transaction when tx,
// waiting for a claim in flight when WithWaitInFlight allows.
func (m *Middleware) claimKey(ctx context.Context, id store.ID, fp store.Fingerprint, tx bool) answer {
	t0 := m.now()
	req := store.ClaimRequest{ID: id, Fingerprint: fp, Lease: m.lease, Retention: m.retention}
	claimParent := ctx
	if !m.cancelOnGone && ctx.Done() != nil {
		// A hang-up does not cancel the claim, as it would not cancel the handler: a
		// claim the store made but the middleware gave up on would answer 409 until
		// its lease ends, and the hang-up would count as a store outage. A context
		// that can never be cancelled (Fiber's, a test's) is kept: detaching it
		// would change nothing but cost an allocation.
		claimParent = context.WithoutCancel(ctx)
	}
	a := answer{id: id}
	if tx {
		a.res, a.tx, a.sent, a.err = m.claimer.ClaimTx(claimParent, req)
	} else {
		a.res, a.sent, a.err = m.claimer.Claim(claimParent, req)
	}
	a.latency = m.since(t0)
	if a.err == nil && a.res.Outcome == store.InFlight && m.wait > 0 {
		var claimTime time.Duration
		var txp *claim.Tx
		if tx {
			txp = &a.tx
		}
		a.res, a.sent, claimTime, a.waited, a.err = m.waitInFlight(ctx, claimParent, req, a.res, a.sent, txp)
		if m.observer != nil {
			a.latency += claimTime
		}
	}
	return a
}

// claimFailed answers a claim the store refused or could not answer: 400 for a
// key the store refuses, 503 (or the handler unprotected, StoreFailureRule.FailOpen) for a
// store failure. It reports whether it answered.
func (m *Middleware) claimFailed(w http.ResponseWriter, r *http.Request, next http.Handler, c *call, body []byte, a *answer) bool {
	ctx, id, err := r.Context(), a.id, a.err
	if err == nil {
		m.storeAnswered(ctx)
		return false
	}
	ev := Event{ID: id, StoreLatency: a.latency, Waited: a.waited, Err: err}
	switch {
	case errors.Is(err, store.ErrInvalid):
		// The store refused the request's own scope and key (say, longer than it
		// can index): a client mistake, answered 400 even in fail-open mode.
		m.writeProblem(w, c, http.StatusBadRequest, m.problems.keyRefused, 0)
		ev.Decision, ev.Status = KeyInvalid, http.StatusBadRequest
	case errors.Is(err, store.ErrFull):
		// The store is up but will not add the key until records expire: fail
		// closed, even in fail-open mode, and no outage.
		m.writeProblem(w, c, http.StatusServiceUnavailable, m.problems.storeDown, max(m.storeRetryAfter, 1))
		ev.Decision, ev.Status = StoreFull, http.StatusServiceUnavailable
	case m.cancelOnGone && ctx.Err() != nil:
		// The client went away (WithCancelOnDisconnect): not the store's failure, and
		// no handler runs for a gone client.
		m.writeProblem(w, c, http.StatusServiceUnavailable, m.problems.storeDown, max(m.storeRetryAfter, 1))
		ev.Decision, ev.Status = ClientGone, http.StatusServiceUnavailable
	case m.failOpen:
		m.storeFailed(ctx, err)
		m.logger.LogAttrs(ctx, slog.LevelDebug, "idempotency store failed; running the handler unprotected (fail open)",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, unprotectedRequest(r, id, body))
		ev.Decision, ev.Status = FailOpen, sw.status()
	default:
		m.storeFailed(ctx, err)
		m.logger.LogAttrs(ctx, slog.LevelDebug, "idempotency store failed; answering 503",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
		m.writeProblem(w, c, http.StatusServiceUnavailable, m.problems.storeDown, max(m.storeRetryAfter, 1))
		ev.Decision, ev.Status = StoreError, http.StatusServiceUnavailable
	}
	m.observe(ctx, ev)
	return true
}

// decide answers the store's answer: replay a completed record, 409 for a claim
// in flight, 422 for another fingerprint, or run the handler under the new
// claim.
func (m *Middleware) decide(w http.ResponseWriter, r *http.Request, next http.Handler, c *call, body []byte,
	route string, fp store.Fingerprint, a *answer) {
	ctx, id, res := r.Context(), a.id, a.res
	switch res.Outcome {
	case store.Completed:
		m.replay(w, c, r, res.Record)
		m.observe(ctx, Event{Decision: Replayed, ID: id, Status: res.Record.Status, StoreLatency: a.latency, CompletedAt: res.Record.CompletedAt, Waited: a.waited})
	case store.InFlight:
		m.writeProblem(w, c, http.StatusConflict, m.problems.inFlight, m.inFlightRetryAfter(route, res.RetryAfter))
		m.observe(ctx, Event{Decision: InFlight, ID: id, Status: http.StatusConflict, StoreLatency: a.latency, Waited: a.waited})
	case store.Mismatch:
		m.writeProblem(w, c, http.StatusUnprocessableEntity, m.mismatchBody(context.WithoutCancel(ctx), id), 0)
		m.observe(ctx, Event{Decision: Mismatch, ID: id, Status: http.StatusUnprocessableEntity, StoreLatency: a.latency, Waited: a.waited})
	case store.Claimed:
		cl := claim.Claim{ID: id, Token: res.Token, Fingerprint: fp, Takeover: res.Takeover, Retention: m.retention,
			CompleteTimeout: m.timeouts.Complete}
		if c.header == nil {
			c.header = make(http.Header)
		}
		x := &execution{m: m, w: w, bufs: c, route: route, tx: a.tx != nil, header: c.header, body: c.body[:0]}
		c.body, c.header = nil, nil // the execution's now; back once no completion reads them (execute)
		m.execute(x, x.handlerRequest(r, cl, body), next, cl, a)
	}
}

// replay writes a stored response: status, stored headers, the replay mark, the
// exact body bytes. The header values are copied (copyRecordHeader), then given
// to the ReplayRule.OnReplay hook, if any.
func (m *Middleware) replay(w http.ResponseWriter, c *call, r *http.Request, rec *store.Record) {
	h := w.Header()
	m.replayHeader(h, c, r, rec)
	vals := c.headerValues(2)
	vals = setValues(h, m.replayedHeader, vals, m.trueVal)
	if rec.BodyOmitted {
		setValues(h, m.omittedHeader, vals, m.omitVal)
	}
	w.WriteHeader(rec.Status)
	if len(rec.Body) > 0 {
		w.Write(rec.Body)
	}
}

// copyRecordHeader sets rec's headers in h, their values copied
// (c.headerValues): a record is shared by every replay of its key (store/memory
// keeps the one it returns), and an outer middleware or the replay hook that
// edits a value in place must not change the next replay.
func (c *call) copyRecordHeader(h http.Header, rec *store.Record) {
	n := 0
	for _, v := range rec.Header {
		n += len(v)
	}
	vals := c.headerValues(n)
	for k, v := range rec.Header {
		vals = setValues(h, k, vals, v)
	}
}

// setValues sets h[k] to a copy of v appended to vals (from call.headerValues),
// capacity-limited so an append reallocates and never overwrites the next
// header's, and returns vals grown.
func setValues(h http.Header, k string, vals, v []string) []string {
	i := len(vals)
	vals = append(vals, v...)
	h[k] = vals[i:len(vals):len(vals)]
	return vals
}

// valueChunk is how many header values a call's chunk holds (see headerValues).
const valueChunk = 64

// headerValues returns an empty array for n header values of a response the
// middleware writes (a replay, a problem), carved from c's current chunk, which
// is never handed out twice: the values a response sends alias neither the
// record nor the middleware's own nor any other response's (an outer middleware
// may edit them in place or keep them past the request), at one allocation per
// valueChunk values. A nil c (no call yet) allocates them.
func (c *call) headerValues(n int) []string {
	if c == nil || n > valueChunk/4 {
		return make([]string, 0, n)
	}
	if cap(c.values)-len(c.values) < n {
		c.values = make([]string, 0, valueChunk)
	}
	i := len(c.values)
	c.values = c.values[:i+n]
	return c.values[i : i : i+n]
}

// handlerRequest returns the request the handler sees: the key in its context
// (KeyFromContext), the claim (claim.FromContext) and, as its body, the bytes the
// middleware read.
//
// The context is detached from the client's connection unless
// WithCancelOnDisconnect is on: a hang-up must not stop a side effect half way.
// A lost lease cancels it, with cause store.ErrLeaseLost (package claim: the
// claim's context cancels itself when detached).
func (x *execution) handlerRequest(r *http.Request, cl claim.Claim, body []byte) *http.Request {
	parent := r.Context()
	hr := &x.hr
	if x.m.cancelOnGone {
		parent, x.cancelLost = context.WithCancelCause(parent)
		hr.ctx.Set(parent, cl, &x.exec)
	} else {
		hr.ctx.SetDetached(parent, cl, &x.exec) // cancels itself on a lost lease
	}
	hr.req = *r.WithContext(&hr.ctx) // inlined: its copy stays on the stack
	hr.body.Reset(body)
	hr.req.Body = &hr.body
	return &hr.req
}

// unprotectedRequest returns the request of a handler that runs without a claim
// (StoreFailureRule.FailOpen): the key in its context, the bytes the middleware
// read as its body.
func unprotectedRequest(r *http.Request, id store.ID, body []byte) *http.Request {
	hr := &handlerReq{}
	hr.ctx.Set(r.Context(), claim.Claim{ID: id}, nil)
	hr.req = *r.WithContext(&hr.ctx)
	hr.body.Reset(body)
	hr.req.Body = &hr.body
	return &hr.req
}

// handlerReq is the handler's request, its context and its body reader, in the
// execution's allocation; never pooled, since a goroutine the handler leaves
// behind may keep any of them.
type handlerReq struct {
	req  http.Request
	ctx  keyCtx
	body requestBody
}

// requestBody is the handler's request body: the bytes the middleware read.
type requestBody struct{ bytes.Reader }

func (*requestBody) Close() error { return nil }

// statusWriter remembers the status of an unprotected (fail-open) response.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 && code >= 200 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusWriter) Flush() { http.NewResponseController(s.ResponseWriter).Flush() }

func (s *statusWriter) status() int {
	if s.code == 0 {
		return http.StatusOK
	}
	return s.code
}
