package middleware

import (
	"cmp"
	"net/http"
	"net/textproto"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/policy"
)

// The options that take a rule (WithRequestFingerprint, WithReplay, WithRelease,
// WithProblems, and those of package policy's rules: WithKey, WithRecordRetention,
// WithStoreFailure, WithPolicy) each set one whole decision: a field left zero
// is its documented default, never what an earlier option set, so a later option
// always wins, back to the default included (docs/architecture.md section 3.1).
// A value out of range makes New fail with an error naming the field.

// WithKey sets where the key is read and which keys are accepted (policy.KeyRule).
func WithKey(k policy.KeyRule) Option { return func(c *config) { c.pol.Key = k } }

// FingerprintRule says what makes a retry the same request (WithRequestFingerprint):
// the fingerprint covers the method, the route, the query, the
// Content-Encoding and the body (package fingerprint).
type FingerprintRule struct {
	// Route names the route in the fingerprint. nil: the path as sent,
	// r.URL.EscapedPath(), so /accounts/1/deposit and /accounts/2/deposit never
	// share a key, nor /orders/7%2Fcancel and /orders/7/cancel, which a ServeMux
	// hands to different patterns. A router that picks a handler by more than the
	// path (the Host, a header) needs a route naming that too, e.g.
	// r.Host + r.URL.EscapedPath().
	Route func(*http.Request) string
	// Body fingerprints request bodies under a rule (fingerprint.OnlyJSONFields,
	// IgnoreJSONFields, NewRule) instead of their raw bytes or their canonical
	// JSON form (CanonicalJSON is then ignored). A client that adds a volatile
	// member (a timestamp, a trace id) is then recognised as the same request, and
	// a change in a member the rule keeps is still 422. A body the rule cannot
	// read (not JSON, under a JSON rule; empty or compressed bodies included) is
	// answered 400 request_body_not_json, nothing stored.
	//
	// The rule's identity is recorded in each fingerprint. Changing the rule of a
	// route (another rule, a rule where there was none) never replays a record
	// made under the old rule, and never runs the handler again for its key: a
	// request whose key has such a record is answered 422
	// fingerprint_rule_changed (the safer of the two choices for payments: a
	// re-run could charge twice). Records made under the old rule end with their
	// retention. A route that drops its rule answers 422
	// key_reused_with_different_payload for them. nil: no rule. See
	// docs/request-rules.md section 1.
	Body *fingerprint.Rule
	// CanonicalJSON fingerprints bodies as canonical JSON (see
	// fingerprint.AppendCanonicalJSON) instead of raw bytes. A body that is not
	// valid JSON is fingerprinted by its raw bytes: the middleware is not a JSON
	// validator, the handler answers the client's mistake (its 4xx is stored and
	// replayed). Use one middleware instance per route group to choose per route.
	// false (the default): raw bytes.
	CanonicalJSON bool
	// MaxBody is the most request body bytes read to fingerprint the request; a
	// larger body is answered 413 request_too_large. 0: DefaultMaxRequestBody
	// (1 MiB). New refuses a negative limit.
	MaxBody int64
}

// WithRequestFingerprint sets what makes a retry the same request (see
// FingerprintRule).
func WithRequestFingerprint(f FingerprintRule) Option {
	return func(c *config) {
		c.route, c.fpRule, c.canonicalJSON, c.maxRequestBody = f.Route, f.Body, f.CanonicalJSON, f.MaxBody
		if c.route == nil {
			c.route = defaultRoute
		}
		if c.maxRequestBody == 0 {
			c.maxRequestBody = DefaultMaxRequestBody
		}
	}
}

// WithRecordRetention sets how long records are kept and replayed
// (policy.RetentionRule).
func WithRecordRetention(r policy.RetentionRule) Option {
	return func(c *config) { c.pol.Retention = r }
}

// ReplayRule says what a replay carries besides the stored status and body, and
// how it is marked (WithReplay).
type ReplayRule struct {
	// Headers, when not nil, is an allow list: only these response headers are
	// stored and replayed (DenyHeaders still apply; an empty, non-nil list: none).
	// nil (the default): every header the handler set is replayed except the
	// denied ones. Headers already present on the ResponseWriter before the
	// handler ran (set by outer middleware, e.g. a request ID) are never stored.
	// New refuses a name that is not an RFC 9110 token.
	Headers []string
	// DenyHeaders are response headers never replayed, added to
	// DefaultDenyHeaders. New refuses a name that is not an RFC 9110 token.
	DenyHeaders []string
	// MaxBody is the storage cap in bytes: a response body over it streams to
	// the client untouched and is stored with its body omitted (store.Response
	// BodyOmitted). 0: DefaultMaxStoredBody (1 MiB). New refuses a negative cap.
	MaxBody int
	// ReplayedHeader marks a replay with the value "true". "":
	// DefaultReplayedHeader (the conformance profile uses "Idempotency-Replayed").
	// New refuses a name that is not an RFC 9110 token.
	ReplayedHeader string
	// OmittedHeader is set to "omitted" on a replay whose body was not stored.
	// "": DefaultOmittedHeader. New refuses a name that is not an RFC 9110 token.
	OmittedHeader string
	// OnReplay is called before each replayed response is written, with the
	// replaying request and the response header, which already holds the stored
	// headers: the application may add this request's own headers (a request id,
	// a rate-limit header) or count a business metric. It cannot change the
	// stored status or body, and the header it gets holds copies of the stored
	// values, so no change reaches the record other replays get. The header map
	// is the hook's own (copied into the response's after it), so a hook may keep
	// it past the call; no adapter reuses it for another request. After it, the
	// replay marks are set again and a Content-Length it set is dropped (net/http
	// sets the stored body's). The request's body has been read by the
	// middleware; OnReplay must not read it. It runs on the request's goroutine,
	// concurrently for concurrent replays. nil: no hook. See
	// docs/request-rules.md section 2.
	OnReplay func(r *http.Request, h http.Header)
}

// WithReplay sets what a replay carries and how it is marked (see ReplayRule).
func WithReplay(p ReplayRule) Option {
	return func(c *config) {
		c.allow, c.deny = nil, append([]string(nil), p.DenyHeaders...)
		if p.Headers != nil {
			c.allow = append([]string{}, p.Headers...)
		}
		c.maxStoredBody, c.onReplay = p.MaxBody, p.OnReplay
		if c.maxStoredBody == 0 {
			c.maxStoredBody = DefaultMaxStoredBody
		}
		c.replayedHeader = textproto.CanonicalMIMEHeaderKey(cmp.Or(p.ReplayedHeader, DefaultReplayedHeader))
		c.omittedHeader = textproto.CanonicalMIMEHeaderKey(cmp.Or(p.OmittedHeader, DefaultOmittedHeader))
	}
}

// ReleaseRule says which answers release the claim, so that the next retry runs
// the handler again, instead of being stored and replayed (WithRelease). A
// panicking or hijacking handler, and an incomplete response (see the package
// doc), always release.
type ReleaseRule struct {
	// Status reports whether a handler's status releases the claim. nil:
	// DefaultRelease.
	Status func(status int) bool
	// StoreUnrouted stores and replays a response no application route produced
	// (a ServeMux's own 404 or 405, or anything wrapped with Unrouted) like a
	// handler's answer. false (the default): such a response releases the claim,
	// so a client whose first try had the wrong method or path can send the
	// corrected request with the same key.
	StoreUnrouted bool
}

// WithRelease sets which answers release the claim (see ReleaseRule).
func WithRelease(r ReleaseRule) Option {
	return func(c *config) {
		c.release, c.releaseUnrouted = r.Status, !r.StoreUnrouted
		if c.release == nil {
			c.release = DefaultRelease
		}
	}
}

// WithStoreFailure sets the store calls' deadlines and the answer when the store
// fails (policy.StoreFailureRule).
func WithStoreFailure(s policy.StoreFailureRule) Option {
	return func(c *config) { c.pol.StoreFailure = s }
}

// WithPolicy sets every shared decision at once (policy.Config): the same value
// configures the gRPC interceptor (middleware/grpc) and idem.Runner. It is
// WithKey, WithLease, WithRecordRetention, WithStoreFailure and WithWaitInFlight
// of c's fields, in that order.
func WithPolicy(p policy.Config) Option { return func(c *config) { c.pol = p } }

// ProblemRule says how the middleware's problem details (RFC 9457) look beyond
// their type, title, status, detail and code (WithProblems).
type ProblemRule struct {
	// TypeBase makes the "type" of each problem base followed by its code, e.g.
	// with "https://api.example.com/problems/" the 409 is of type
	// "https://api.example.com/problems/request_in_flight", a page your API
	// documents (RFC 9457 section 3.1.1: a type URI should resolve to
	// human-readable documentation). "": ProblemTypePrefix, a URN that does not
	// resolve.
	//
	// With a base, the problems of the IETF draft's error scenarios (the 400 of a
	// missing key, the 422 of a key reused, and the 409 of a request in flight,
	// draft-ietf-httpapi-idempotency-key-header-07 section 2.7, which shows each
	// with "Link: <documentation>; rel="describedby"") also carry
	// Link: <type>; rel="describedby" (RFC 8288), the same URI as their type; the
	// 422 fingerprint_rule_changed does too, as a key reused. Other problems have
	// no Link. New refuses a base that is not an absolute http or https URL with
	// a host ending in '/' (no user information, query or fragment), holds a
	// byte outside the URI characters, or is over MaxTypeBaseLen bytes. See
	// docs/request-rules.md section 4.
	TypeBase string
	// Members adds extension members (RFC 9457 section 3.2) to every problem the
	// middleware answers: it is called with the problem's code (the Code
	// constants) and detail and returns the members to add (nil or empty: none),
	// which are rendered after the problem's own, in the order of their names.
	// The problems whose detail never varies are rendered once, in New; for the
	// ones whose detail does (CodeKeyInvalid on a malformed or refused key,
	// CodeBodyUnreadable, CodeRequestTooLarge, CodeBodyNotJSON,
	// CodeBodyDuplicateName) Members is called
	// on each such request, concurrently, so it must be safe for concurrent use
	// and should return the same members for the same code. New calls it for
	// every code (a sample detail for the variable ones) and fails when it
	// panics, names one of the five members above (in any case), or returns a
	// value encoding/json cannot encode. Should it fail later on a detail New did
	// not see, that problem is sent without extension members. Use it when
	// clients read other members than code and detail, for example the Celeriant
	// reference page, which shows "message" and branches on "error"
	// (docs/account-service.md section 1.3). nil: none.
	Members func(code, detail string) map[string]any
}

// WithProblems sets the type base and extension members of the middleware's
// problems (see ProblemRule).
func WithProblems(p ProblemRule) Option {
	return func(c *config) { c.typeBase, c.problemMembers = p.TypeBase, p.Members }
}
