package middleware

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/internal/httpfield"
	"github.com/idemkey/idemkey/policy"
)

// Defaults of the options.
const (
	// DefaultReplayedHeader marks a replayed response with the value "true".
	DefaultReplayedHeader = "Idempotent-Replayed"
	// DefaultOmittedHeader is set to "omitted" on a replay whose body was over the
	// storage cap.
	DefaultOmittedHeader = "Idempotency-Replay"
	// DefaultMaxRequestBody is the fingerprint limit in bytes (1 MiB); a larger
	// request body is answered 413.
	DefaultMaxRequestBody int64 = 1 << 20
	// DefaultMaxStoredBody is the storage cap in bytes (1 MiB); a larger response
	// streams through and is stored with its body omitted.
	DefaultMaxStoredBody = 1 << 20
)

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

// Option configures a Middleware: one of the With functions (docs/options.md
// lists them by the decision each one makes).
type Option func(*config)

type config struct {
	pol policy.Config // the shared decisions as the options set them; New resolves them into the fields below

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
	timeouts        claim.Timeouts
	cancelOnGone    bool
	wait            time.Duration
	observer        Observer
	problemMembers  func(code, detail string) map[string]any
	logger          *slog.Logger
	clock           claim.Clock
	featureConfig   // features.go
}

func defaultConfig() config {
	return config{
		methods:         defaultMethods(),
		maxRequestBody:  DefaultMaxRequestBody,
		maxStoredBody:   DefaultMaxStoredBody,
		route:           defaultRoute,
		replayedHeader:  DefaultReplayedHeader,
		omittedHeader:   DefaultOmittedHeader,
		release:         DefaultRelease,
		releaseUnrouted: true,
		clock:           claim.RealClock{},
	}
}

// defaultRoute names a request's route in the fingerprint by the path as sent
// (FingerprintRule.Route).
func defaultRoute(r *http.Request) string { return r.URL.EscapedPath() }

// validate checks the shared decisions (policy.Config.Validate) and the HTTP
// ones, then resolves the shared ones into the fields the requests read.
func (c *config) validate() error {
	if err := c.pol.Validate(); err != nil {
		return fmt.Errorf("idemkey/middleware: %w", err)
	}
	p := c.pol.WithDefaults()
	c.keyHeader = textproto.CanonicalMIMEHeaderKey(p.Key.Header)
	c.required, c.keyValidator = !p.Key.Optional, p.Key.Validate
	c.lease, c.retention, c.maxRetention = p.Lease, p.Retention.Default, p.Retention.Max
	c.timeouts, c.storeRetryAfter, c.failOpen = p.StoreFailure.Timeouts, p.StoreFailure.RetryAfter, p.StoreFailure.FailOpen
	c.wait = p.WaitInFlight
	switch {
	case c.maxRequestBody < 0:
		return fmt.Errorf("idemkey/middleware: FingerprintRule.MaxBody %d must not be negative", c.maxRequestBody)
	case c.maxStoredBody < 0:
		return fmt.Errorf("idemkey/middleware: ReplayRule.MaxBody %d must not be negative", c.maxStoredBody)
	case !httpfield.ValidName(c.replayedHeader) || !httpfield.ValidName(c.omittedHeader):
		return fmt.Errorf("idemkey/middleware: ReplayRule.ReplayedHeader %q and OmittedHeader %q must be tokens (RFC 9110 section 5.1)",
			c.replayedHeader, c.omittedHeader)
	}
	for _, meth := range c.methods {
		if !httpfield.ValidName(meth) { // a method is a token too (RFC 9110 section 9.1)
			return fmt.Errorf("idemkey/middleware: protected method %q is not an RFC 9110 token", meth)
		}
	}
	// A name no response can carry never matches: the list would not say what
	// it seems to.
	for _, list := range [][]string{c.allow, c.deny} {
		for _, h := range list {
			if !httpfield.ValidName(h) {
				return fmt.Errorf("idemkey/middleware: ReplayRule header %q is not a header field name (RFC 9110 section 5.1)", h)
			}
		}
	}
	return nil
}

// DefaultRelease releases the claim (the next retry runs the handler again)
// for 5xx, 408 Request Timeout, 409 Conflict, 425 Too Early and 429 Too Many
// Requests: answers that say "try again" rather than "this is the result".
// Everything else is stored and replayed (docs/architecture.md section 3).
func DefaultRelease(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return status >= 500
}

// WithMethods sets the protected methods, compared case-sensitively with the
// request's (RFC 9110 section 9.1). Requests with other methods pass through and
// their key is ignored (IETF draft section 1). No names: the default, POST and
// PATCH (as no names is the default in the gRPC interceptor's WithMethods, every
// unary method). New refuses a method that is not an RFC 9110 token.
func WithMethods(methods ...string) Option {
	return func(c *config) {
		if len(methods) == 0 {
			c.methods = defaultMethods()
			return
		}
		c.methods = append([]string(nil), methods...)
	}
}

// defaultMethods returns the methods protected by default.
func defaultMethods() []string { return []string{http.MethodPost, http.MethodPatch} }

// WithLease sets the claim lease (policy.Config.Lease: 0 is claim.DefaultLease,
// else at least claim.MinLease and at most the retention; renewed every third of
// it while the handler runs).
func WithLease(d time.Duration) Option { return func(c *config) { c.pol.Lease = d } }

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

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithClock replaces the clock that schedules lease renewal (nil: the real
// one, as idem.WithClock). Tests use it to fire renewals without sleeping. If
// clk also has a method Now() time.Time, it measures handler durations too (the
// estimate behind a 409's Retry-After).
func WithClock(clk claim.Clock) Option {
	return func(c *config) {
		if clk == nil {
			clk = claim.RealClock{}
		}
		c.clock = clk
	}
}

// nowOf returns clk's Now if it has one, else monotonic: the middleware only
// subtracts its readings.
func nowOf(clk claim.Clock, monotonic func() time.Time) func() time.Time {
	if n, ok := clk.(interface{ Now() time.Time }); ok {
		return n.Now
	}
	return monotonic
}
