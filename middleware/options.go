package middleware

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/internal/httpfield"
)

// Defaults of the options.
const (
	// DefaultKeyHeader is the request header carrying the key (IETF draft section 2).
	DefaultKeyHeader = "Idempotency-Key"
	// DefaultReplayedHeader marks a replayed response with the value "true".
	DefaultReplayedHeader = "Idempotent-Replayed"
	// DefaultOmittedHeader is set to "omitted" on a replay whose body was over the
	// storage cap.
	DefaultOmittedHeader = "Idempotency-Replay"
	// DefaultLease is how long a claim is exclusive without renewal
	// (claim.DefaultLease).
	DefaultLease = claim.DefaultLease
	// MinLease is the shortest lease New accepts (claim.MinLease): the lease is
	// renewed every third of it, and a shorter one would make renewals spin and
	// duplicates take over a live handler's key.
	MinLease = claim.MinLease
	// DefaultRetention is how long a record is kept and replayed.
	DefaultRetention = claim.DefaultRetention
	// DefaultMaxRequestBody is the fingerprint limit in bytes (1 MiB); a larger
	// request body is answered 413.
	DefaultMaxRequestBody int64 = 1 << 20
	// DefaultMaxStoredBody is the storage cap in bytes (1 MiB); a larger response
	// streams through and is stored with its body omitted.
	DefaultMaxStoredBody = 1 << 20
	// DefaultStoreRetryAfter is the Retry-After of a 503 when the store fails.
	DefaultStoreRetryAfter = time.Second
	// DefaultStoreTimeout bounds each Claim, Complete and Release call
	// (WithStoreTimeouts); Renew's default is a third of the lease, at most this.
	DefaultStoreTimeout = claim.DefaultStoreTimeout
)

// StoreTimeouts bound the store calls (WithStoreTimeouts; claim.Timeouts). A
// zero field keeps its default; a call that runs out of time is a store error: a
// claim is answered 503 store_unavailable with Retry-After, a completion is
// retried while the lease is held, a release or renewal is logged (the lease then
// ends on its own).
type StoreTimeouts = claim.Timeouts

// DefaultDenyHeaders are never stored for replay, whatever the allow list says:
// cookies, Date, Content-Length (recomputed for the replayed body), the hop-by-hop
// headers of RFC 9110 section 7.6.1, Retry-After and Age (relative to the
// original moment). Headers starting with RateLimit, X-RateLimit or X-Rate-Limit
// (rate-limit state of the original moment), trailers, the replay marker headers
// and the headers named by a Connection header are also never replayed.
var DefaultDenyHeaders = []string{
	"Set-Cookie", "Set-Cookie2", "Date", "Content-Length",
	"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Te", "Trailer", "Upgrade",
	"Proxy-Authenticate", "Proxy-Authorization", "Retry-After", "Age",
}

// Option configures a Middleware.
type Option func(*config)

type config struct {
	keyHeader       string
	methods         []string
	required        bool
	lease           time.Duration
	retention       time.Duration
	maxRequestBody  int64
	maxStoredBody   int
	canonicalJSON   bool
	route           func(*http.Request) string
	replayedHeader  string
	omittedHeader   string
	allow           []string
	deny            []string
	release         func(status int) bool
	failOpen        bool
	releaseUnrouted bool
	storeRetryAfter time.Duration
	timeouts        StoreTimeouts
	cancelOnGone    bool
	wait            time.Duration
	observer        Observer
	problemMembers  func(code, detail string) map[string]any
	logger          *slog.Logger
	clock           Clock
	featureConfig   // WithFingerprint, WithOnReplay, WithKeyValidator, WithProblemTypeBase, WithMaxRetention
}

func defaultConfig() config {
	return config{
		keyHeader:       DefaultKeyHeader,
		methods:         []string{http.MethodPost, http.MethodPatch},
		required:        true,
		lease:           DefaultLease,
		retention:       DefaultRetention,
		maxRequestBody:  DefaultMaxRequestBody,
		maxStoredBody:   DefaultMaxStoredBody,
		route:           func(r *http.Request) string { return r.URL.EscapedPath() },
		replayedHeader:  DefaultReplayedHeader,
		omittedHeader:   DefaultOmittedHeader,
		release:         DefaultReleasePolicy,
		releaseUnrouted: true,
		storeRetryAfter: DefaultStoreRetryAfter,
		clock:           claim.RealClock{},
	}
}

// validate checks what package claim does not (it checks the lease, the
// retention and the store timeouts): the HTTP knobs.
func (c *config) validate() error {
	switch {
	case c.maxRequestBody < 0 || c.maxStoredBody < 0:
		return errors.New("idemkey/middleware: negative body limit")
	case !httpfield.ValidName(c.keyHeader) || !httpfield.ValidName(c.replayedHeader) || !httpfield.ValidName(c.omittedHeader):
		// A key header no request can carry would answer every client 400.
		return fmt.Errorf("idemkey/middleware: header names %q, %q, %q: each must be a token (RFC 9110 section 5.1)",
			c.keyHeader, c.replayedHeader, c.omittedHeader)
	case len(c.methods) == 0:
		return errors.New("idemkey/middleware: no protected method (WithMethods)")
	case c.route == nil || c.release == nil || c.clock == nil:
		return errors.New("idemkey/middleware: nil route, release policy or clock")
	case c.wait < 0:
		return fmt.Errorf("idemkey/middleware: wait bound %v must not be negative", c.wait)
	}
	for _, meth := range c.methods {
		if !httpfield.ValidName(meth) { // a method is a token too (RFC 9110 section 9.1)
			return fmt.Errorf("idemkey/middleware: protected method %q is not an RFC 9110 token", meth)
		}
	}
	return nil
}

// DefaultReleasePolicy releases the claim (the next retry runs the handler again)
// for 5xx, 408 Request Timeout, 409 Conflict, 425 Too Early and 429 Too Many
// Requests: answers that say "try again" rather than "this is the result".
// Everything else is stored and replayed (docs/architecture.md section 3).
func DefaultReleasePolicy(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return status >= 500
}

// WithKeyHeader sets the request header that carries the key (default
// "Idempotency-Key"); New refuses a name that is not an RFC 9110 token.
func WithKeyHeader(name string) Option {
	return func(c *config) { c.keyHeader = textproto.CanonicalMIMEHeaderKey(name) }
}

// WithMethods sets the protected methods (default POST and PATCH), compared
// case-sensitively with the request's (RFC 9110 section 9.1). Requests with other
// methods pass through and their key is ignored (IETF draft section 1). New
// refuses an empty list and a method that is not an RFC 9110 token.
func WithMethods(methods ...string) Option {
	return func(c *config) { c.methods = append([]string(nil), methods...) }
}

// WithKeyRequired says whether a protected request without a key is refused with
// 400 idempotency_key_missing (true, the default) or passes through unprotected.
func WithKeyRequired(required bool) Option { return func(c *config) { c.required = required } }

// WithLease sets the claim lease (default 10s; at least MinLease, at most the
// retention; New refuses others).
// The lease is renewed every third of it while the handler runs.
func WithLease(d time.Duration) Option { return func(c *config) { c.lease = d } }

// WithRetention sets how long a record is kept and replayed (default 24h).
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// WithMaxRequestBody sets the request body limit of the fingerprint in bytes
// (default 1 MiB); a larger body is answered 413 request_too_large.
func WithMaxRequestBody(n int64) Option { return func(c *config) { c.maxRequestBody = n } }

// WithMaxStoredBody sets the storage cap in bytes (default 1 MiB). A response body
// over it streams to the client untouched and is stored with BodyOmitted.
func WithMaxStoredBody(n int) Option { return func(c *config) { c.maxStoredBody = n } }

// WithCanonicalJSON fingerprints bodies as canonical JSON (see
// fingerprint.AppendCanonicalJSON) instead of raw bytes. A body that is not valid
// JSON is fingerprinted by its raw bytes: the middleware is not a JSON validator,
// the handler answers the client's mistake (its 4xx is stored and replayed).
// Use one middleware instance per route group to choose per route.
func WithCanonicalJSON(on bool) Option { return func(c *config) { c.canonicalJSON = on } }

// WithRoute sets how the route is named in the fingerprint (default: the path
// as sent, r.URL.EscapedPath(), so /accounts/1/deposit and /accounts/2/deposit
// never share a key, nor /orders/7%2Fcancel and /orders/7/cancel, which a
// ServeMux hands to different patterns; see the fingerprint package for the
// rule). A router that picks a handler by more than the path (the Host, a
// header) needs a route naming that too, e.g. r.Host + r.URL.EscapedPath().
func WithRoute(f func(*http.Request) string) Option { return func(c *config) { c.route = f } }

// WithReplayedHeader sets the header that marks a replay with "true" (default
// "Idempotent-Replayed"; the conformance profile uses "Idempotency-Replayed").
func WithReplayedHeader(name string) Option {
	return func(c *config) { c.replayedHeader = textproto.CanonicalMIMEHeaderKey(name) }
}

// WithOmittedHeader sets the header set to "omitted" on a replay whose body was
// not stored (default "Idempotency-Replay").
func WithOmittedHeader(name string) Option {
	return func(c *config) { c.omittedHeader = textproto.CanonicalMIMEHeaderKey(name) }
}

// WithReplayHeaders switches to an allow list: only these response headers are
// stored and replayed (the deny list still applies). Without it every header the
// handler set is replayed except the denied ones; headers already present on the
// ResponseWriter before the handler ran (set by outer middleware, e.g. a request
// ID) are never stored.
func WithReplayHeaders(names ...string) Option {
	return func(c *config) { c.allow = append([]string{}, names...) }
}

// WithDenyHeaders adds response headers that are never replayed, to
// DefaultDenyHeaders.
func WithDenyHeaders(names ...string) Option {
	return func(c *config) { c.deny = append(c.deny, names...) }
}

// WithReleasePolicy sets which handler statuses release the claim instead of
// storing the response (default DefaultReleasePolicy). A panicking or hijacking
// handler, and an incomplete response (see the package doc), always release.
func WithReleasePolicy(release func(status int) bool) Option {
	return func(c *config) { c.release = release }
}

// WithReleaseUnrouted says whether a response no application route produced (a
// ServeMux's own 404 or 405, or anything wrapped with Unrouted) releases
// the claim (true, the default) or is stored and replayed like a handler's
// answer. With true, a client whose first try had the wrong method or path can
// send the corrected request with the same key.
func WithReleaseUnrouted(on bool) Option { return func(c *config) { c.releaseUnrouted = on } }

// WithFailOpen runs the handler unprotected when the store cannot answer a claim,
// instead of the default 503 store_unavailable (fail closed). The key is still in
// the request context, so an idempotent write downstream still deduplicates.
// A store that answers but is full (store.ErrFull) is still answered 503: a
// flood of new keys must not turn the protection off.
func WithFailOpen(on bool) Option { return func(c *config) { c.failOpen = on } }

// WithStoreRetryAfter sets the Retry-After of the 503 answered when the store
// fails (default 1s; sent in whole seconds, rounded down as every Retry-After the
// middleware sends, and at least 1).
func WithStoreRetryAfter(d time.Duration) Option { return func(c *config) { c.storeRetryAfter = d } }

// WithStoreTimeouts sets the deadlines of the store calls (see StoreTimeouts;
// zero fields keep their defaults, negative ones make New fail). A hung store
// then answers 503 within the Claim bound instead of holding the request for the
// client's whole timeout. Stores that never wait on I/O (store.InProcess, the
// memory store) run without deadlines.
func WithStoreTimeouts(t StoreTimeouts) Option { return func(c *config) { c.timeouts = t } }

// WithCancelOnDisconnect(true) gives the handler the request's own context, which
// net/http cancels when the client disconnects. The default (false) keeps the
// claim and the handler running when the client hangs up: neither context is
// cancelled (both keep the request's values), the lease keeps being renewed, the whole response is
// captured although writes to the dead connection fail, and it is stored, so the
// retry replays it instead of running the side effect a second time.
//
// With cancellation on, a handler that stops early (it wrote nothing, or a write
// failed, after its client went away) has its claim released, a claim the hang-up
// cancelled is answered 503 without counting as a store outage, and the retry runs
// the handler again: choose it only for handlers whose side effects are safe to
// repeat, or that complete in their own transaction (an interrupted transaction
// rolls back).
func WithCancelOnDisconnect(on bool) Option { return func(c *config) { c.cancelOnGone = on } }

// WithObserver sets the observer called once per request (default none). An
// observer that also implements StoreObserver is called around each store call.
func WithObserver(o Observer) Option { return func(c *config) { c.observer = o } }

// WithProblemMembers adds extension members (RFC 9457 section 3.2) to every
// problem the middleware answers, beside type, title, status, detail and code:
// members is called with the problem's code (the Code* constants) and detail
// and returns the members to add (nil or empty: none), which are rendered after
// the problem's own, in the order of their names. The problems whose detail
// never varies are rendered once, in New; for the four whose detail does
// (CodeKeyInvalid on a malformed or refused key, CodeBodyUnreadable,
// CodeRequestTooLarge, CodeBodyNotJSON)
// members is called on each such request, concurrently, so it must be safe for
// concurrent use and should return the same members for the same code. New
// calls it for every code (a sample detail for the variable ones) and fails when
// it panics, names one of the five members above (in any case), or returns a
// value encoding/json cannot encode. Should it fail later on a detail New did
// not see, that problem is sent without extension members. Use it when clients
// read other members than code and detail, for example the Celeriant
// reference page, which shows "message" and branches on "error"
// (docs/account-service.md section 1.3).
func WithProblemMembers(members func(code, detail string) map[string]any) Option {
	return func(c *config) { c.problemMembers = members }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithClock replaces the clock that schedules lease renewal (default the real
// one). Tests use it to fire renewals without sleeping. If clk also has a method
// Now() time.Time, it measures handler durations too (the estimate behind a
// 409's Retry-After).
func WithClock(clk Clock) Option { return func(c *config) { c.clock = clk } }

// nowOf returns clk's Now if it has one, else monotonic: the middleware only
// subtracts its readings.
func nowOf(clk Clock, monotonic func() time.Time) func() time.Time {
	if n, ok := clk.(interface{ Now() time.Time }); ok {
		return n.Now
	}
	return monotonic
}

// Clock schedules lease renewals and completion back-offs (claim.Clock).
type Clock = claim.Clock

// Timer is a scheduled call, like *time.Timer (claim.Timer).
type Timer = claim.Timer
