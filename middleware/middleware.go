// Package middleware makes HTTP write endpoints safe to retry: the
// Idempotency-Key middleware for net/http (IETF draft
// draft-ietf-httpapi-idempotency-key-header-07; docs/architecture.md section 3).
//
// For a protected request (POST and PATCH by default) the middleware parses the
// key, fingerprints the request (package fingerprint), and claims (scope, key)
// in a store.Store with a lease; then exactly one row of the decision table of
// docs/architecture.md section 3 applies (a new key runs the handler once and
// stores its answer, a retry gets the replay, a duplicate in flight 409, another
// payload under the key 422, a missing or invalid key 400, a store that cannot
// answer 503). That table is the one normative statement of the decisions; the
// tests check it row by row.
//
// Errors are RFC 9457 application/problem+json with type, title, status, detail
// and a stable code member (see the Code constants).
//
// # Use
//
//	st := memory.New() // or store/postgres, store/redis: records every replica shares
//	m, err := middleware.New(st, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
//	if err != nil { ... } // a misconfiguration fails here, never as a 400 later
//	err = http.ListenAndServe(addr, m.Handler(mux))
//
// In a handler, KeyFromContext returns the scope and key (e.g. to derive a
// downstream idempotency key). Scope keys by your authenticated principal in
// production (ScopeFromPrincipal); README.md has the complete Postgres program.
//
// # Options
//
// New takes one option per decision (docs/options.md). The decisions every entry
// point makes are package policy's: WithKey, WithLease, WithRecordRetention,
// WithStoreFailure and WithWaitInFlight, or all of them at once with
// WithPolicy(policy.Config), the value the gRPC interceptor and idem take too.
// The HTTP ones are WithMethods, WithRequestFingerprint, WithReplay, WithRelease,
// WithProblems, WithCancelOnDisconnect, WithObserver, WithLogger and WithClock.
// Each option sets its whole decision: a zero field is the documented default,
// and a later option replaces an earlier one (docs/architecture.md section 3.1).
// The options apply to every request a Middleware wraps: a route that needs
// other decisions gets a Middleware of its own (the shared options, then its
// own) wrapping only its handler. Never nest two Middlewares over one store: the
// inner one finds the key claimed by the outer one and answers 409 every time
// (Example (PerRoute) of Middleware.Handler).
//
// The handler reads the scope and key with KeyFromContext, and its claim (fencing
// token included) with claim.FromContext.
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
//     CompleteTx and claim.MarkCompleted), fenced by the claim's token: the rows and the
//     record commit together, and a holder whose lease was taken over cannot commit.
//   - External side effects (a payment provider): pass the key, or a key derived
//     from it, downstream; the provider deduplicates on it.
//   - An event log (the account service on Celeriant): derive the event ID from the
//     scope and key, so a second append is refused by the log.
//
// For every handler: a client hang-up does not cancel it (WithCancelOnDisconnect),
// each store call has a deadline (WithStoreFailure), and a failed completion is
// retried while the lease is held, so none of these runs a request twice. After the
// handler returns, its client waits for one store call at most (the completion or
// the release, under its bound); retries go on in the background (package claim).
//
// # Adapters
//
// Middleware.Handler has the shape func(http.Handler) http.Handler, so routers
// whose handlers write to the http.ResponseWriter (chi: middleware/chitest) reuse the
// core unchanged. Routers with handlers of their own shape have adapter modules: middleware/echo
// (echo v4) and middleware/echov5 (echo v5), which also render a handler's
// returned error inside the middleware so that response is the one stored and
// replayed, middleware/gin, which captures what gin writes through c.Writer, and
// middleware/fiber and middleware/fiberv3 (Fiber v2, v3). gRPC has an interceptor
// on the same stores and policy: middleware/grpc.
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
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
)

// ScopeFunc returns the scope of a request: the authenticated principal or
// tenant that owns its keys. Two scopes never see each other's records. Any
// string; "" is the global scope.
type ScopeFunc func(r *http.Request) string

// GlobalScope puts every key in one scope: clients share a key space. Choose it
// explicitly, only when keys are unguessable and clients trust each other.
func GlobalScope(*http.Request) string { return "" }

type ctxKey struct{}

// keyCtx carries the request's store.ID and, while its handler runs under a
// claim, the claim and its execution (claim.Context); allocated with the
// handler's request (handlerReq). unrouted is set by Unrouted.
type keyCtx struct {
	claim.Context
	unrouted atomic.Bool
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
// ReleaseRule.Status).
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
func (m *Middleware) unrouted(next http.Handler, r *http.Request, c *execution) bool {
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
// when the request passed through unprotected without a key. The result is a
// store.ID, two strings (Scope, Key), because it is the library's one name for
// a scoped key: Claim.ID is the same value, and store calls take it
// (docs/options.md, "The key in the handler").
func KeyFromContext(ctx context.Context) (id store.ID, ok bool) {
	if c, ok := ctx.Value(ctxKey{}).(*keyCtx); ok {
		return c.ID(), true
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
	denyLens uint64 // bit n: a denied name is n bytes long (bit 63: 63 or more)
	allow    map[string]struct{}
	problems prerendered
	// Header values of the middleware's own answers, copied into each response
	// (call.headerValues), never sent themselves.
	trueVal, omitVal []string
	problemHeaders   []string
	retryAfterVals   [][]string // Retry-After field values of 0 to preRetryAfter-1 s, copied like problemHeaders
	pool             sync.Pool
	work             *workEstimate   // recent handler durations, for a 409's Retry-After
	outage           store.OutageLog // the current run of store failures, logged once
	clockNow         func() time.Time
	monoClock        bool          // clockNow is monotonicNow (no clock of the caller's with Now)
	storeObs         StoreObserver // the observer, when it implements StoreObserver
	claimer          *claim.Claimer
	epoch            time.Time // origin of the middleware's monotonic readings
	featureState
}

// preRetryAfter bounds the Retry-After values (seconds) rendered once per
// Middleware, so a 409 or 503 within it allocates no header value: two minutes
// cover the default lease and store back-off.
const preRetryAfter = 120

// New returns a middleware claiming keys in s, scoped by scope, configured by
// opts (docs/options.md). Both s and scope are required: a global scope must be
// chosen explicitly (GlobalScope). It fails on a nil store or scope, on a
// policy value out of range (policy.Config.Validate), and on an HTTP setting out
// of range: a negative body limit, a replay header name or
// method that is not an RFC 9110 token, a problem type base that is
// not an absolute URI, problem members that cannot be rendered. The error names
// the field or option.
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
	if err := m.config.validate(); err != nil {
		return nil, err
	}
	if m.logger == nil {
		m.logger = slog.Default()
	}
	m.storeObs, _ = m.observer.(StoreObserver)
	var err error
	cfg := claim.Config{Store: s, Lease: m.lease, Retention: m.retention, MaxRetention: m.maxRetention,
		Timeouts: m.timeouts, Clock: m.clock, Logger: m.logger}
	if m.storeObs != nil {
		cfg.Observe = func(ctx context.Context, op claim.Op, id store.ID) (context.Context, func(error)) {
			return m.storeObs.StoreCallStart(ctx, StoreOp(op), id)
		}
	}
	if m.claimer, err = claim.New(cfg); err != nil {
		return nil, fmt.Errorf("idemkey/middleware: %w", err)
	}
	m.timeouts = m.claimer.Timeouts()
	m.deny = make(map[string]struct{})
	for _, h := range append(append(append([]string{}, DefaultDenyHeaders...), m.config.deny...), m.replayedHeader, m.omittedHeader) {
		m.deny[textproto.CanonicalMIMEHeaderKey(h)] = struct{}{}
		m.denyLens |= 1 << min(len(h), 63)
	}
	if m.config.allow != nil {
		m.allow = make(map[string]struct{})
		for _, h := range m.config.allow {
			m.allow[textproto.CanonicalMIMEHeaderKey(h)] = struct{}{}
		}
	}
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
	m.pool.New = func() any { return new(call) }
	return m, nil
}

// Handler returns next protected by the middleware. Its shape,
// func(http.Handler) http.Handler, fits net/http chains and router adapters
// (middleware/echo, middleware/echov5, middleware/gin).
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next, false) })
}

// OneTx returns next protected in the one-transaction mode (docs/architecture.md
// section 9.1): the claim, every statement next runs in the transaction the
// store hands it (store/postgres TxFromContext) and the record commit once, or
// not at all. The store must hold claims in transactions (claim.TxStore:
// store/postgres Store.OneTx); OneTx panics otherwise, like http.Handle with a
// nil handler, while the routes are set up. Other routes of the same
// middleware keep the default mode (Handler).
//
// next answers as usual; every answer is held until the transaction ended and
// reaches the client only then (Flush and 1xx responses are not passed on): a
// stored answer (2xx, 4xx) commits with the record and every retry replays it;
// an answer the key is released for (5xx, 408, 409, 425, 429, a panic) rolls the
// transaction back. When the commit fails, or the handler ended or left the
// transaction itself, the client gets 503 store_unavailable (the configured
// problem, with Retry-After) instead: never a success for rows that did not
// commit. next completes nothing itself (no store/postgres CommitResponse or
// CompleteTx): claim.MarkCompleted is refused with claim.ErrOneTx.
func (m *Middleware) OneTx(next http.Handler) http.Handler {
	if !m.claimer.HoldsTx() {
		panic(fmt.Sprintf("idemkey/middleware: OneTx: the store (%T) holds no claim in a transaction (claim.TxStore; store/postgres Store.OneTx)", m.store))
	}
	if next == nil {
		panic("idemkey/middleware: OneTx: nil handler")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next, true) })
}

// Wait waits until the store work the middleware does after its requests
// returned has ended, or ctx is done (then ctx's error): completions retried in
// the background after their one attempt failed (Event.CompletionPending, at
// most a lease each) and claims released in the background (claim.Claimer.Wait).
// Call it on shutdown after http.Server.Shutdown returned, before closing the
// store: a completion cut short by the program's exit is not stored, and its key
// stays claimed until the lease ends (then the next request runs the handler
// again).
func (m *Middleware) Wait(ctx context.Context) error { return m.claimer.Wait(ctx) }

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
