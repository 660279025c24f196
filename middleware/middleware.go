// Package middleware makes HTTP write endpoints safe to retry: the
// Idempotency-Key middleware for net/http (IETF draft
// draft-ietf-httpapi-idempotency-key-header-07; docs/architecture.md section 3).
//
// For a protected request (POST and PATCH by default) the middleware parses the
// key, fingerprints the request (package fingerprint), and claims (scope, key)
// in a store.Store with a lease. Then, one row of the decision table applies:
//
//	method not protected                      pass through, key ignored
//	key missing, required (default)           400 idempotency_key_missing
//	key missing, optional                     pass through, nothing stored
//	key invalid (empty, only spaces, over      400 idempotency_key_invalid
//	  255 bytes) or several header lines,
//	  or refused by the store (ErrInvalid)
//	scope over store.MaxScopeLen (1024 bytes) 400 idempotency_scope_invalid
//	request body over the limit (1 MiB)       413 request_too_large
//	new key, or expired lease (takeover)      run the handler once, store the response
//	same key and fingerprint, completed       replay status, headers, exact body bytes
//	                                          + "Idempotent-Replayed: true"
//	same key and fingerprint, lease live      409 request_in_flight, Retry-After:
//	                                          the route's recent handler duration
//	                                          (whole seconds, rounded up), at least
//	                                          1 s, at most the rest of the lease
//	same key and fingerprint, lease live,     wait up to the bound for the original:
//	  WithWaitInFlight                          its replay, or run if it released the
//	                                            key or its lease expired; past the
//	                                            bound 409 as above
//	same key, other fingerprint               422 key_reused_with_different_payload
//	same key, record made under another        422 fingerprint_rule_changed
//	  fingerprint rule (WithFingerprint)
//	body not JSON under a JSON rule            400 request_body_not_json
//	key refused by WithKeyValidator            400 idempotency_key_invalid
//	handler answers 5xx/408/409/425/429,      release the claim, then send the
//	  panics (re-panicked) or hijacks           response (held until released, so an
//	                                            immediate retry runs, never a 409)
//	no application route answered (a         release the claim; the corrected
//	  ServeMux's own 404/405, or a router's     request with the same key runs
//	  answer wrapped with Unrouted)
//	client hangs up while the handler runs    the handler's context is not cancelled;
//	                                            its whole response is stored and
//	                                            replayed (WithCancelOnDisconnect:
//	                                            cancelled, and released when it stops
//	                                            early)
//	response incomplete: body shorter than    release the claim (no truncated answer
//	  its Content-Length                        for every retry)
//	handler completed the record in its own   nothing more stored; the committed
//	  transaction (MarkCompleted)               record is what retries replay
//	response body over the cap (1 MiB)        streamed untouched, stored with body
//	                                          omitted; replay adds
//	                                          "Idempotency-Replay: omitted"
//	store error or hung store (no answer      503 store_unavailable, Retry-After
//	  within the claim bound, 5 s)              (or run unprotected with WithFailOpen);
//	                                          logged once per outage (its start, a
//	                                          count every minute, its end), each
//	                                          request at debug level
//	completion fails (store error)            retried with back-off while the lease
//	                                            is held, for at most one lease;
//	                                            duplicates get 409 meanwhile
//	completion refused (lease taken over)     logged with slog; nothing overwritten
//
// Errors are RFC 9457 application/problem+json with type, title, status, detail
// and a stable code member (see the Code constants).
//
// The handler reads the scope and key with KeyFromContext, and its claim (fencing
// token included) with ClaimFromContext.
//
// # Which guarantee holds for which handler
//
// A process can die between a side effect and the stored response, and a lease can
// expire under a slow handler, so the middleware alone runs a handler at most once
// per lease, not exactly once (docs/architecture.md section 9). What closes the gap
// depends on where the side effect lives:
//
//   - Own Postgres data: exactly once. The handler completes the record in its own
//     transaction with the response it sends (store/postgres CommitResponse, or
//     CompleteTx and MarkCompleted), fenced by the claim's token: the rows and the
//     record commit together, and a holder whose lease was taken over cannot commit.
//   - External side effects (a payment provider): pass the key, or a key derived
//     from it, downstream; the provider deduplicates on it.
//   - An event log (the account service on Celeriant): derive the event ID from the
//     scope and key, so a second append is refused by the log.
//
// For every handler: a client hang-up does not cancel it (WithCancelOnDisconnect),
// each store call has a deadline (WithStoreTimeouts), and a failed completion is
// retried while the lease is held, so none of these runs a request twice.
//
// # Adapters
//
// Middleware.Handler has the shape func(http.Handler) http.Handler, so routers
// whose handlers write to the http.ResponseWriter (chi: middleware/chitest) reuse the
// core unchanged. Routers that do not have adapter modules: middleware/echo
// (echo v4) and middleware/echov5 (echo v5), which also render a handler's
// returned error inside the middleware so that response is the one stored and
// replayed, and middleware/gin, which captures what gin writes through c.Writer.
// On the client side, package client keeps one key across a request's retries.
//
// # Bodies and buffers
//
// The request body is read once (at most the fingerprint limit), hashed, and
// handed to the handler as the same bytes; the response body is copied once into
// the capture buffer while it streams to the client. Both buffers are pooled:
// the handler must not use the request body or the ResponseWriter after it
// returns (as net/http requires), and Store.Complete must copy the Body and
// Header it keeps, since they are reused once it returns (store/memory copies).
package middleware

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/internal/httpfield"
	"github.com/idemkey/idemkey/store"
)

// ScopeFunc returns the scope of a request: the authenticated principal or
// tenant that owns its keys. Two scopes never see each other's records. Any
// string; "" is the global scope.
type ScopeFunc func(r *http.Request) string

// GlobalScope puts every key in one scope: clients share a key space. Choose it
// explicitly, only when keys are unguessable and clients trust each other.
func GlobalScope(*http.Request) string { return "" }

// ScopeFromHeader returns a ScopeFunc that reads the request header name, and
// returns fallback when it is absent or empty (the first line when it is sent on
// several).
//
// It is a stand-in for tests and demos: any client can send any header value and
// so read another client's stored responses by guessing its keys. In production
// scope by the authenticated principal (WithPrincipal and ScopeFromPrincipal), or
// use ScopeFromHeader only behind a gateway that authenticates the header and
// strips it from client requests.
//
// The keyless clients' scope (fallback) is never shared with a client that sends
// the fallback's value in the header: such a request gets its own scope, the value
// prefixed with a NUL byte, which no header value can carry (RFC 9110 section
// 5.5), so it cannot be forged either. With ScopeFromHeader("X-Client-ID",
// "anonymous"), "X-Client-ID: anonymous" does not see the keyless clients'
// records. A header over store.MaxScopeLen bytes is answered 400
// idempotency_scope_invalid by the middleware.
func ScopeFromHeader(name, fallback string) ScopeFunc {
	name = textproto.CanonicalMIMEHeaderKey(name)
	return func(r *http.Request) string {
		if v := r.Header[name]; len(v) > 0 && v[0] != "" {
			if v[0] == fallback {
				return "\x00" + fallback
			}
			return v[0]
		}
		return fallback
	}
}

type ctxKey struct{}

// keyCtx carries the request's store.ID and, while its handler runs under a
// claim, the claim and its call; allocated with the handler's request
// (handlerReq), and kept to 112 bytes so that the two fit a 416-byte size class
// (Retention comes from the call's middleware). unrouted is set by Unrouted.
type keyCtx struct {
	context.Context
	id       store.ID
	token    store.Token       // zero without a claim (fail open)
	fp       store.Fingerprint // zero without a claim
	call     *call             // nil without a claim
	takeover bool
	unrouted atomic.Bool
}

// claim returns the claim the handler runs under (ok false without one).
func (c *keyCtx) claim() (Claim, bool) {
	if c.call == nil {
		return Claim{}, false
	}
	return Claim{ID: c.id, Token: c.token, Fingerprint: c.fp, Takeover: c.takeover, Retention: c.call.recordRetention()}, true
}

func (c *keyCtx) Value(k any) any {
	if k == (ctxKey{}) {
		return c
	}
	return c.Context.Value(k)
}

// Unrouted wraps a router's own answer to a request that no application route
// matched (not found, method not allowed, a redirect to the canonical path), so
// that the middleware releases the request's key instead of storing that answer:
// the client's corrected request with the same key then runs. A handler's own
// 404 is the application's answer and stays replayable (see
// WithReleasePolicy).
//
// An *http.ServeMux passed directly to Handler needs no wrapping for its 404 and
// 405: the middleware reads the Pattern the mux sets on the request, empty when
// no pattern matched (Go 1.22 and later; not under GODEBUG=httpmuxgo121=1), and
// its redirect to the canonical path ("/dir" to "/dir/", "/a//b" to "/a/b") is
// recognised by its Location. Any other router, or a ServeMux behind other
// middleware, cannot be told apart from a handler: wrap its not-found and
// method-not-allowed handlers with Unrouted, e.g. for chi
// r.NotFound(middleware.Unrouted(http.NotFoundHandler()).ServeHTTP). Without the
// key in the request context (an unprotected request) it only runs h.
func Unrouted(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(ctxKey{}).(*keyCtx); ok {
			c.unrouted.Store(true)
		}
		h.ServeHTTP(w, r)
	})
}

// unrouted reports whether the response to r (the request the handler got) came
// from the router rather than an application route: marked by Unrouted, or
// answered by a ServeMux (next itself) that matched no pattern or redirected to
// the canonical path (see muxRedirect).
func (m *Middleware) unrouted(next http.Handler, r *http.Request, c *call) bool {
	if !m.releaseUnrouted {
		return false
	}
	if k, ok := r.Context().(*keyCtx); ok && k.unrouted.Load() {
		return true
	}
	_, mux := next.(*http.ServeMux)
	return mux && (r.Pattern == "" || muxRedirect(r, c.status, c.Header()))
}

// KeyFromContext returns the scope and idempotency key of the request whose
// context ctx is (or derives from), as the middleware parsed them. ok is false
// when the request passed through unprotected without a key.
func KeyFromContext(ctx context.Context) (id store.ID, ok bool) {
	if c, ok := ctx.Value(ctxKey{}).(*keyCtx); ok {
		return c.id, true
	}
	return store.ID{}, false
}

// Middleware is the idempotency middleware; build it with New. Safe for
// concurrent use.
type Middleware struct {
	config
	store    store.Store
	scope    ScopeFunc
	deny     map[string]struct{}
	allow    map[string]struct{}
	problems prerendered
	// Header values shared by all responses, never modified in place.
	trueVal, omitVal []string
	problemHeaders   []string
	retryAfterVals   [][]string // Retry-After field values of 0 to preRetryAfter-1 s, shared like problemHeaders
	pool             sync.Pool
	work             *workEstimate // recent handler durations, for a 409's Retry-After
	outage           outage        // the current run of store failures, logged once
	clockNow         func() time.Time
	monoClock        bool          // clockNow is monotonicNow (no clock of the caller's with Now)
	storeObs         StoreObserver // the observer, when it implements StoreObserver
	bounded          bool          // store calls run under m.timeouts
	epoch            time.Time     // origin of call.held (monotonic)
	featureState
}

// preRetryAfter bounds the Retry-After values (seconds) rendered once per
// Middleware, so a 409 or 503 within it allocates no header value: two minutes
// cover the default lease and store back-off.
const preRetryAfter = 120

// noCancel is the cancel function of an unbounded store call.
func noCancel() {}

// storeCtx returns parent bounded by d for one store call, unless the store
// never waits on I/O (store.InProcess): then parent itself, with no timer.
func (m *Middleware) storeCtx(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if !m.bounded {
		return parent, noCancel
	}
	return context.WithTimeout(parent, d)
}

// New returns a middleware claiming keys in s, scoped by scope. Both are
// required: a global scope must be chosen explicitly (GlobalScope). It fails on a
// nil store or scope, a lease under MinLease, a retention shorter than the lease,
// negative body limits or store timeouts, a renewal timeout longer than the lease,
// no protected method, a header name or method that is not an RFC 9110 token, a
// negative wait bound, or problem members that cannot be rendered
// (WithProblemMembers).
func New(s store.Store, scope ScopeFunc, opts ...Option) (*Middleware, error) {
	if s == nil {
		return nil, errors.New("idemkey/middleware: nil store")
	}
	if scope == nil {
		return nil, errors.New("idemkey/middleware: nil scope function (use GlobalScope to share one key space)")
	}
	m := &Middleware{config: defaultConfig(), store: s, scope: scope, epoch: time.Now()}
	for _, o := range opts {
		o(&m.config)
	}
	switch {
	case m.lease < MinLease:
		return nil, fmt.Errorf("idemkey/middleware: lease %v under the minimum %v (it is renewed every third of it)", m.lease, MinLease)
	case m.retention < m.lease:
		return nil, fmt.Errorf("idemkey/middleware: retention %v shorter than the lease %v", m.retention, m.lease)
	case m.maxRequestBody < 0 || m.maxStoredBody < 0:
		return nil, errors.New("idemkey/middleware: negative body limit")
	case !httpfield.ValidName(m.keyHeader) || !httpfield.ValidName(m.replayedHeader) || !httpfield.ValidName(m.omittedHeader):
		// A key header no request can carry would answer every client 400.
		return nil, fmt.Errorf("idemkey/middleware: header names %q, %q, %q: each must be a token (RFC 9110 section 5.1)",
			m.keyHeader, m.replayedHeader, m.omittedHeader)
	case len(m.methods) == 0:
		return nil, errors.New("idemkey/middleware: no protected method (WithMethods)")
	case m.route == nil || m.release == nil || m.clock == nil:
		return nil, errors.New("idemkey/middleware: nil route, release policy or clock")
	case m.timeouts.Claim < 0 || m.timeouts.Complete < 0 || m.timeouts.Release < 0 || m.timeouts.Renew < 0:
		return nil, fmt.Errorf("idemkey/middleware: negative store timeout in %+v", m.timeouts)
	case m.wait < 0:
		return nil, fmt.Errorf("idemkey/middleware: wait bound %v must not be negative", m.wait)
	case m.timeouts.Renew > m.lease:
		return nil, fmt.Errorf("idemkey/middleware: renewal timeout %v longer than the lease %v (a renewal that slow cannot hold it)", m.timeouts.Renew, m.lease)
	}
	for _, meth := range m.methods {
		if !httpfield.ValidName(meth) { // a method is a token too (RFC 9110 section 9.1)
			return nil, fmt.Errorf("idemkey/middleware: protected method %q is not an RFC 9110 token", meth)
		}
	}
	for _, d := range []*time.Duration{&m.timeouts.Claim, &m.timeouts.Complete, &m.timeouts.Release} {
		if *d == 0 {
			*d = DefaultStoreTimeout
		}
	}
	if m.timeouts.Renew == 0 {
		m.timeouts.Renew = min(m.lease/3, DefaultStoreTimeout)
	}
	if ip, ok := s.(store.InProcess); !ok || !ip.InProcess() {
		m.bounded = true
	}
	if m.logger == nil {
		m.logger = slog.Default()
	}
	m.storeObs, _ = m.observer.(StoreObserver)
	m.deny = make(map[string]struct{})
	for _, h := range append(append(append([]string{}, DefaultDenyHeaders...), m.config.deny...), m.replayedHeader, m.omittedHeader) {
		m.deny[textproto.CanonicalMIMEHeaderKey(h)] = struct{}{}
	}
	if m.config.allow != nil {
		m.allow = make(map[string]struct{})
		for _, h := range m.config.allow {
			m.allow[textproto.CanonicalMIMEHeaderKey(h)] = struct{}{}
		}
	}
	var err error
	if m.problems, err = newPrerendered(m.problemStyle()); err != nil {
		return nil, err
	}
	if err := m.initFeatures(); err != nil {
		return nil, err
	}
	m.work = newWorkEstimate()
	m.clockNow = nowOf(m.clock, m.monotonicNow)
	_, ownNow := m.clock.(interface{ Now() time.Time })
	m.monoClock = !ownNow
	m.trueVal, m.omitVal = []string{"true"}, []string{"omitted"}
	m.problemHeaders = []string{ProblemContentType, "no-store", "nosniff"}
	m.retryAfterVals = make([][]string, preRetryAfter)
	for i := range m.retryAfterVals {
		m.retryAfterVals[i] = []string{strconv.Itoa(i)}
	}
	m.pool.New = func() any {
		c := &call{m: m, header: make(http.Header)}
		c.renewFn = c.renew
		return c
	}
	return m, nil
}

// Handler returns next protected by the middleware. Its shape,
// func(http.Handler) http.Handler, fits net/http chains and router adapters
// (middleware/echo, middleware/echov5, middleware/gin).
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
}

func (m *Middleware) protected(method string) bool {
	for _, p := range m.methods {
		if p == method {
			return true
		}
	}
	return false
}

func (m *Middleware) observe(ctx context.Context, e Event) {
	if m.observer != nil {
		m.observer.Observe(ctx, e)
	}
}

// storeCall tells the StoreObserver, if any, that op starts; callers use the
// context it returns for the call and pass its error to storeDone.
func (m *Middleware) storeCall(ctx context.Context, op StoreOp, id store.ID) (context.Context, func(error)) {
	if m.storeObs == nil {
		return ctx, nil
	}
	return m.storeObs.StoreCallStart(ctx, op, id)
}

func storeDone(done func(error), err error) {
	if done != nil {
		done(err)
	}
}

func (m *Middleware) since(t time.Time) time.Duration {
	if m.observer == nil {
		return 0
	}
	return time.Since(t)
}

func (m *Middleware) now() time.Time {
	if m.observer == nil {
		return time.Time{}
	}
	return m.monotonicNow()
}

// monotonicNow reads only the monotonic clock, which is cheaper than time.Now: a
// time to subtract from other readings (Sub, time.Since), never to show.
func (m *Middleware) monotonicNow() time.Time { return m.epoch.Add(time.Since(m.epoch)) }

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	ctx := r.Context()
	if !m.protected(r.Method) {
		next.ServeHTTP(w, r)
		m.observe(ctx, Event{Decision: PassThrough})
		return
	}
	values := r.Header[m.keyHeader]
	if len(values) == 0 {
		if !m.required {
			next.ServeHTTP(w, r)
			m.observe(ctx, Event{Decision: NoKey})
			return
		}
		m.writeProblem(w, http.StatusBadRequest, m.problems.missing, 0)
		m.observe(ctx, Event{Decision: KeyMissing, Status: http.StatusBadRequest})
		return
	}
	var key string
	var err error
	if len(values) > 1 {
		err = keyError("sent in several header lines")
	} else {
		key, err = ParseKey(values[0])
	}
	if err != nil {
		m.writeProblem(w, http.StatusBadRequest, problem{Title: "Invalid Idempotency-Key header",
			Status: http.StatusBadRequest, Code: CodeKeyInvalid,
			Detail: "The " + m.keyHeader + " header must be one Structured Field string (or a bare token) of 1 to 255 printable ASCII characters, not only spaces: " +
				strings.TrimPrefix(err.Error(), "idemkey/middleware: invalid idempotency key: ") + "."}.render(m.problemStyle()), 0)
		m.observe(ctx, Event{Decision: KeyInvalid, Status: http.StatusBadRequest})
		return
	}
	if m.keyValidator != nil {
		if err := m.keyValidator(key); err != nil {
			m.refuseKey(w, ctx, err)
			return
		}
	}
	id := store.ID{Scope: m.scope(r), Key: key}
	if len(id.Scope) > store.MaxScopeLen {
		m.writeProblem(w, http.StatusBadRequest, m.problems.scopeTooLong, 0)
		m.observe(ctx, Event{Decision: KeyInvalid, ID: id, Status: http.StatusBadRequest})
		return
	}

	c := m.pool.Get().(*call)
	pooled := false
	defer func() {
		if pooled {
			if c.w == nil {
				c.resetUnstarted() // no handler ran under a claim (replay, 409, 422, ...)
			} else {
				c.reset()
			}
			m.pool.Put(c)
		}
	}()

	body, err := fingerprint.ReadBody(r.Body, r.ContentLength, m.maxRequestBody, c.reqBuf)
	c.reqBuf = body[:0]
	if err != nil {
		pooled = true
		if errors.Is(err, fingerprint.ErrBodyTooLarge) {
			m.writeProblem(w, http.StatusRequestEntityTooLarge, problem{Title: "Request body too large",
				Status: http.StatusRequestEntityTooLarge, Code: CodeRequestTooLarge,
				Detail: fmt.Sprintf("The request body is larger than %d bytes, the most this operation fingerprints.", m.maxRequestBody)}.render(m.problemStyle()), 0)
			m.observe(ctx, Event{Decision: BodyTooLarge, ID: id, Status: http.StatusRequestEntityTooLarge})
			return
		}
		m.writeProblem(w, http.StatusBadRequest, problem{Title: "Request body unreadable",
			Status: http.StatusBadRequest, Code: CodeBodyUnreadable,
			Detail: "The request body could not be read completely."}.render(m.problemStyle()), 0)
		m.observe(ctx, Event{Decision: BodyUnreadable, ID: id, Status: http.StatusBadRequest, Err: err})
		return
	}
	fpReq := fingerprint.Request{Method: r.Method, Route: m.route(r), RawQuery: r.URL.RawQuery, Body: body,
		ContentEncoding: fingerprint.ContentEncoding(r.Header)}
	fp, err := fingerprint.Sum(fpReq, fingerprint.Options{CanonicalJSON: m.canonicalJSON, Rule: m.fpRule})
	if err != nil && m.fpRule != nil { // the rule cannot read the body: the client's mistake
		pooled = true
		m.refuseBody(w, ctx, id, err)
		return
	}
	if err != nil { // invalid JSON: the handler judges the body; fingerprint its raw bytes
		fp, _ = fingerprint.Sum(fpReq, fingerprint.Options{})
	}

	t0 := m.now()
	req := store.ClaimRequest{ID: id, Fingerprint: fp, Lease: m.lease, Retention: m.retention}
	claimParent := ctx
	if !m.cancelOnGone {
		// A hang-up does not cancel the claim, as it would not cancel the handler: a
		// claim the store made but the middleware gave up on would answer 409 until
		// its lease ends, and the hang-up would count as a store outage.
		c.ctx.set(ctx)
		claimParent = &c.ctx
	}
	cctx, cancel := m.storeCtx(claimParent, m.timeouts.Claim)
	cctx, done := m.storeCall(cctx, StoreClaim, id)
	res, err := m.store.Claim(cctx, req)
	cancel()
	latency := m.since(t0)
	storeDone(done, err)
	err = checkClaim(res, err)
	var waited time.Duration
	if err == nil && res.Outcome == store.InFlight && m.wait > 0 {
		var claimTime time.Duration
		res, claimTime, waited, err = m.waitInFlight(ctx, claimParent, req, res)
		err = checkClaim(res, err)
		if m.observer != nil {
			latency += claimTime
		}
	}
	if errors.Is(err, store.ErrInvalid) {
		// The store refused the request's own scope and key (say, longer than it
		// can index): a client mistake, answered 400 even in fail-open mode.
		pooled = true
		m.writeProblem(w, http.StatusBadRequest, m.problems.keyRefused, 0)
		m.observe(ctx, Event{Decision: KeyInvalid, ID: id, Status: http.StatusBadRequest, StoreLatency: latency, Waited: waited, Err: err})
		return
	}
	if err != nil && m.cancelOnGone && ctx.Err() != nil {
		// The client went away (WithCancelOnDisconnect): not the store's failure, and
		// no handler runs for a gone client.
		pooled = true
		m.writeProblem(w, http.StatusServiceUnavailable, m.problems.storeDown, max(m.storeRetryAfter, 1))
		m.observe(ctx, Event{Decision: StoreError, ID: id, Status: http.StatusServiceUnavailable, StoreLatency: latency, Waited: waited, Err: err})
		return
	}
	if err != nil {
		m.storeFailed(ctx, err)
		if m.failOpen {
			m.logger.LogAttrs(ctx, slog.LevelDebug, "idempotency store failed; running the handler unprotected (fail open)",
				slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
			pooled = true
			sw := &statusWriter{ResponseWriter: w}
			next.ServeHTTP(sw, c.handlerRequest(r, Claim{ID: id}, nil, body))
			m.observe(ctx, Event{Decision: FailOpen, ID: id, Status: sw.status(), StoreLatency: latency, Waited: waited, Err: err})
			return
		}
		m.logger.LogAttrs(ctx, slog.LevelDebug, "idempotency store failed; answering 503",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
		pooled = true
		m.writeProblem(w, http.StatusServiceUnavailable, m.problems.storeDown, max(m.storeRetryAfter, 1))
		m.observe(ctx, Event{Decision: StoreError, ID: id, Status: http.StatusServiceUnavailable, StoreLatency: latency, Waited: waited, Err: err})
		return
	}
	m.storeAnswered(ctx)
	switch res.Outcome {
	case store.Completed:
		pooled = true
		m.replay(w, r, res.Record)
		m.observe(ctx, Event{Decision: Replayed, ID: id, Status: res.Record.Status, StoreLatency: latency, CompletedAt: res.Record.CompletedAt, Waited: waited})
	case store.InFlight:
		pooled = true
		m.writeProblem(w, http.StatusConflict, m.problems.inFlight, m.inFlightRetryAfter(fpReq.Route, res.RetryAfter))
		m.observe(ctx, Event{Decision: InFlight, ID: id, Status: http.StatusConflict, StoreLatency: latency, Waited: waited})
	case store.Mismatch:
		pooled = true
		m.writeProblem(w, http.StatusUnprocessableEntity, m.mismatchBody(claimParent, id), 0)
		m.observe(ctx, Event{Decision: Mismatch, ID: id, Status: http.StatusUnprocessableEntity, StoreLatency: latency, Waited: waited})
	case store.Claimed:
		claim := Claim{ID: id, Token: res.Token, Fingerprint: fp, Takeover: res.Takeover, Retention: m.retention}
		c.route = fpReq.Route
		pooled = m.execute(c, w, c.handlerRequest(r, claim, c, body), next, id, res, latency, waited)
	}
}

// checkClaim turns an answer no store may give into an error (a store failure).
func checkClaim(res store.ClaimResult, err error) error {
	if err == nil && (res.Outcome < store.Claimed || res.Outcome > store.Mismatch ||
		res.Outcome == store.Completed && res.Record == nil || res.Outcome == store.Claimed && res.Token.IsZero()) {
		err = fmt.Errorf("idemkey/middleware: store answered an invalid claim result (outcome %v)", res.Outcome)
	}
	return err
}

// handlerRequest returns the request the handler sees: the key in its context
// (KeyFromContext), the claim when it runs under one (ClaimFromContext; cl is
// then the call) and, as its body, the bytes the middleware read.
//
// Under a claim the context is detached from the client's connection unless
// WithCancelOnDisconnect is on: a hang-up must not stop a side effect half way.
func (c *call) handlerRequest(r *http.Request, claim Claim, cl *call, body []byte) *http.Request {
	parent := r.Context()
	if cl != nil && !c.m.cancelOnGone {
		parent = context.WithoutCancel(parent)
	}
	hr := &handlerReq{ctx: keyCtx{Context: parent, id: claim.ID, token: claim.Token, fp: claim.Fingerprint,
		call: cl, takeover: claim.Takeover}}
	hr.req = *r.WithContext(&hr.ctx) // inlined: its copy stays on the stack
	c.reqBody.Reset(body)
	hr.req.Body = &c.reqBody
	return &hr.req
}

// handlerReq is the handler's request and its context in one allocation; neither
// is pooled, since a goroutine the handler leaves behind may keep either.
type handlerReq struct {
	req http.Request
	ctx keyCtx
}

// replay writes a stored response: status, stored headers, the replay mark, the
// exact body bytes.
func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, rec *store.Record) {
	h := w.Header()
	m.replayHeader(h, r, rec) // through the WithOnReplay hook, if any
	h[m.replayedHeader] = m.trueVal
	if rec.BodyOmitted {
		h[m.omittedHeader] = m.omitVal
	}
	w.WriteHeader(rec.Status)
	if len(rec.Body) > 0 {
		w.Write(rec.Body)
	}
}

// execute runs the handler under the claim, then completes or releases it. It
// reports whether c may go back to the pool.
func (m *Middleware) execute(c *call, w http.ResponseWriter, r *http.Request, next http.Handler,
	id store.ID, res store.ClaimResult, latency, waited time.Duration) (reusable bool) {
	held := time.Since(m.epoch) // one reading: the lease is known held, and the handler starts
	c.start(w, r.Context(), id, res.Token, held)
	if h := w.Header(); len(h) > 0 {
		for k := range h {
			c.pre = append(c.pre, k) // set by outer middleware: not the handler's to replay
		}
	}
	ev := Event{ID: id, Takeover: res.Takeover, Waited: waited}
	returned := false
	defer func() {
		if returned {
			return
		}
		// The handler panicked (or called runtime.Goexit): release, then re-panic.
		// A held response (see call.hold) is never sent. A record the handler
		// completed in its own transaction before it panicked (MarkCompleted) is
		// committed: not released, and a cache in front of the store is told.
		p := recover()
		inTx := c.handlerReturned()
		c.stopRenewal()
		ev.Status = c.status
		if inTx {
			ev.Decision, ev.InTransaction = Executed, true
			ev.StoreLatency = latency + m.notifyCompleted(c)
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
	}()
	began := m.epoch.Add(held) // m.monotonicNow() read at held
	if !m.monoClock {
		began = m.clockNow()
	}
	next.ServeHTTP(c, r)
	returned = true
	inTx := c.handlerReturned()
	m.work.observe(c.route, m.clockNow().Sub(began))
	reusable = c.stopRenewal()

	wroteNothing := !c.wroteHeader
	if wroteNothing {
		c.commit(http.StatusOK) // net/http sends 200 for a handler that wrote nothing
	}
	ev.Status = c.status
	var err error
	switch {
	case inTx:
		// The handler completed the record in its own transaction (MarkCompleted):
		// the store already holds it; a cache in front of it is told, best effort.
		ev.Decision, ev.InTransaction = Executed, true
		ev.StoreLatency = m.notifyCompleted(c)
		c.unhold()
	case c.released || c.hijacked || c.status == http.StatusSwitchingProtocols || m.release(c.status) ||
		c.incomplete(r.Context(), wroteNothing) || m.unrouted(next, r, c):
		if c.hijacked {
			ev.Status = 0
		}
		ev.Decision = Released
		c.releaseNow() // before a held response's first byte reaches the client
		err = c.releaseErr
		ev.StoreLatency = c.releaseLatency
		c.unhold()
	default:
		ev.Decision = Executed
		if c.renewLost.Load() {
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
		err, ev.CompleteRetries, again = m.complete(c, resp)
		if ev.CompleteRetries > 0 && !c.stopRenewal() {
			reusable = false // a renewal restarted for the retries may still look at c
		}
		ev.StoreLatency = m.since(t0)
		switch {
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
	}
	ev.Err = err
	ev.StoreLatency += latency
	m.observe(r.Context(), ev)
	return reusable
}

// notifyCompleted tells a store that keeps a copy of records (store.CompletionNotifier)
// that the handler completed c's record in its own transaction, best effort, and
// returns the time it took (0 without an observer).
func (m *Middleware) notifyCompleted(c *call) time.Duration {
	n, ok := m.store.(store.CompletionNotifier)
	if !ok {
		return 0
	}
	t0 := m.now()
	ctx, cancel := m.storeCtx(&c.ctx, m.timeouts.Complete)
	n.NotifyCompleted(ctx, c.id, c.token, c.txResp, c.recordRetention())
	cancel()
	return m.since(t0)
}

// Back-off of completion retries: doubling from minCompleteBackoff, at most a
// third of the lease.
const minCompleteBackoff = 20 * time.Millisecond

// complete stores resp. When the store fails (an error other than ErrLeaseLost or
// ErrInvalid), the lease is renewed again and Complete retried with back-off until
// it succeeds, the lease is lost, the lease can no longer be held (no successful
// claim or renewal within the last lease), or the retries have lasted one lease
// (a completion that keeps failing while renewals pass must not hold the request
// forever): until then duplicates get 409, never a second execution. The response
// is flushed to the client before the first retry. It returns the last error, the
// number of retries and whether a retry succeeded; after retries the caller stops
// the renewals again.
func (m *Middleware) complete(c *call, resp store.Response) (err error, retries int, again bool) {
	backoff := minCompleteBackoff
	var (
		failed time.Time     // the first failure
		waited time.Duration // the back-offs so far (the clock may be a test's)
	)
	for {
		ctx, cancel := m.storeCtx(&c.ctx, m.timeouts.Complete)
		ctx, done := m.storeCall(ctx, StoreComplete, c.id)
		err = m.store.Complete(ctx, c.id, c.token, resp, c.recordRetention())
		cancel()
		storeDone(done, err)
		if err == nil {
			return nil, retries, retries > 0
		}
		if retries == 0 {
			failed = time.Now()
		}
		if errors.Is(err, store.ErrLeaseLost) || errors.Is(err, store.ErrInvalid) || c.renewLost.Load() ||
			time.Since(c.heldAt())+backoff >= m.lease || max(time.Since(failed), waited)+backoff > m.lease {
			return err, retries, false
		}
		if retries == 0 {
			_ = http.NewResponseController(c.w).Flush() // the client need not wait for the store
			c.restartRenewal()
		}
		retries++
		m.logger.LogAttrs(context.Background(), slog.LevelWarn, "idempotency store failed to complete; retrying while the lease is held",
			slog.String("scope", c.id.Scope), slog.String("key", c.id.Key), slog.Int("retry", retries), slog.Any("error", err))
		wait := make(chan struct{})
		m.clock.AfterFunc(backoff, func() { close(wait) })
		<-wait
		waited += backoff
		backoff = min(2*backoff, max(m.lease/3, minCompleteBackoff))
	}
}

func (m *Middleware) logRelease(c *call, err error) {
	level := slog.LevelError
	if errors.Is(err, store.ErrLeaseLost) {
		level = slog.LevelWarn
	}
	m.logger.LogAttrs(context.Background(), level, "idempotency claim release failed",
		slog.String("scope", c.id.Scope), slog.String("key", c.id.Key), slog.Any("error", err))
}

// replayable reports whether the response header k may be stored for replay,
// but for the headers a Connection header names (see namedBy), which are not
// stored either unless an allow list names them.
func (m *Middleware) replayable(k string, pre []string) bool {
	if _, deny := m.deny[k]; deny {
		return false
	}
	if m.allow != nil {
		_, ok := m.allow[k]
		return ok
	}
	if hasPrefixFold(k, "Ratelimit") || hasPrefixFold(k, "X-Ratelimit") || hasPrefixFold(k, "X-Rate-Limit") ||
		strings.HasPrefix(k, http.TrailerPrefix) {
		return false
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

// requestBody is the handler's request body: the bytes the middleware read.
type requestBody struct{ bytes.Reader }

func (*requestBody) Close() error { return nil }
