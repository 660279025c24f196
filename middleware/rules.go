package middleware

import (
	"net/http"
	"net/textproto"
	"time"

	"github.com/idemkey/idemkey/fingerprint"
)

// The options that take a rule (WithKey, WithRequestFingerprint,
// WithRecordRetention, WithReplay, WithRelease, WithStoreFailure, WithProblems)
// each configure one decision, in several fields. A field left zero keeps its
// setting: the default, or what an earlier option of the same kind set; so
// WithKey(KeyRule{Optional: true}) changes only whether a key is required. The
// zero of each field is documented beside it; a value that is not zero and
// invalid (a header name that is no token, a negative duration or size) makes
// New fail. See docs/options.md.

// fields marks the fields of a rule that the deprecated single-value options
// (deprecated.go) set, zero values included, so that WithKeyHeader("") still
// makes New fail and WithKeyRequired(true) still undoes WithKeyRequired(false).
// It goes with them.
type fields uint8

// sets reports whether a rule's field is to be applied: it is not zero, or a
// deprecated option set it.
func (f fields) sets(bit fields, nonZero bool) bool { return nonZero || f&bit != 0 }

// The bits of fields, by the field's position in its rule.
const (
	field1 fields = 1 << iota
	field2
	field3
	field4
	field5
	field6
)

// KeyRule says where a request's idempotency key is read and which keys are
// accepted (WithKey).
type KeyRule struct {
	// Header is the request header carrying the key. "": DefaultKeyHeader
	// (IETF draft section 2). New refuses a name that is not an RFC 9110 token
	// (section 5.1): a key header no request can carry would answer every client 400.
	Header string
	// Optional lets a protected request without a key pass through unprotected,
	// nothing stored. false (the default): it is answered 400
	// idempotency_key_missing.
	Optional bool
	// Validate is a rule on keys, applied after ParseKey accepted the key: a key
	// it refuses is answered 400 idempotency_key_invalid with the error's text as
	// the problem's detail (so write it for the client: say what a key must look
	// like), nothing stored, the handler not run. UUIDKeys is one such rule. The
	// IETF draft asks servers to publish their key format and validate every key
	// against it (draft-ietf-httpapi-idempotency-key-header-07, section 5). It
	// runs on each protected request with a key, concurrently, before the claim.
	// nil: no rule beyond ParseKey's. See docs/request-rules.md section 3.
	Validate func(key string) error

	set fields
}

// WithKey sets where the key is read and which keys are accepted (see KeyRule;
// its zero fields keep their settings).
func WithKey(k KeyRule) Option {
	return func(c *config) {
		if k.set.sets(field1, k.Header != "") {
			c.keyHeader = textproto.CanonicalMIMEHeaderKey(k.Header)
		}
		if k.set.sets(field2, k.Optional) {
			c.required = !k.Optional
		}
		if k.set.sets(field3, k.Validate != nil) {
			c.keyValidator = k.Validate
		}
	}
}

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

	set fields
}

// WithRequestFingerprint sets what makes a retry the same request (see
// FingerprintRule; its zero fields keep their settings).
func WithRequestFingerprint(f FingerprintRule) Option {
	return func(c *config) {
		if f.set.sets(field1, f.Route != nil) {
			c.route = f.Route
		}
		if f.set.sets(field2, f.Body != nil) {
			c.fpRule = f.Body
		}
		if f.set.sets(field3, f.CanonicalJSON) {
			c.canonicalJSON = f.CanonicalJSON
		}
		if f.set.sets(field4, f.MaxBody != 0) {
			c.maxRequestBody = f.MaxBody
		}
	}
}

// RetentionRule says how long records are kept and replayed (WithRecordRetention).
type RetentionRule struct {
	// Default is how long a record is kept and replayed, counted from its
	// completion on the store's clock. 0: DefaultRetention (24 h). New refuses a
	// retention shorter than the lease.
	Default time.Duration
	// Max is the longest retention SetRetention may give a record. 0: Default, so
	// a handler may only shorten its record's life. New refuses a maximum shorter
	// than Default, or negative.
	Max time.Duration

	set fields
}

// WithRecordRetention sets how long records are kept and replayed (see
// RetentionRule; its zero fields keep their settings).
func WithRecordRetention(r RetentionRule) Option {
	return func(c *config) {
		if r.set.sets(field1, r.Default != 0) {
			c.retention = r.Default
		}
		if r.set.sets(field2, r.Max != 0) {
			c.maxRetention = r.Max
		}
	}
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
	// DefaultDenyHeaders (and to those of an earlier WithReplay). New refuses a
	// name that is not an RFC 9110 token.
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
	// values, so no change reaches the record other replays get. After it, the
	// replay marks are set again and a Content-Length it set is dropped (net/http
	// sets the stored body's). The request's body has been read by the
	// middleware; OnReplay must not read it. It runs on the request's goroutine,
	// concurrently for concurrent replays. nil: no hook. See
	// docs/request-rules.md section 2.
	OnReplay func(r *http.Request, h http.Header)

	set fields
}

// WithReplay sets what a replay carries and how it is marked (see ReplayRule;
// its zero fields keep their settings, DenyHeaders adds to the list).
func WithReplay(p ReplayRule) Option {
	return func(c *config) {
		if p.set.sets(field1, p.Headers != nil) {
			c.allow = append([]string{}, p.Headers...)
		}
		c.deny = append(c.deny, p.DenyHeaders...)
		if p.set.sets(field3, p.MaxBody != 0) {
			c.maxStoredBody = p.MaxBody
		}
		if p.set.sets(field4, p.ReplayedHeader != "") {
			c.replayedHeader = textproto.CanonicalMIMEHeaderKey(p.ReplayedHeader)
		}
		if p.set.sets(field5, p.OmittedHeader != "") {
			c.omittedHeader = textproto.CanonicalMIMEHeaderKey(p.OmittedHeader)
		}
		if p.set.sets(field6, p.OnReplay != nil) {
			c.onReplay = p.OnReplay
		}
	}
}

// ReleaseRule says which answers release the claim, so that the next retry runs
// the handler again, instead of being stored and replayed (WithRelease). A
// panicking or hijacking handler, and an incomplete response (see the package
// doc), always release.
type ReleaseRule struct {
	// Status reports whether a handler's status releases the claim. nil:
	// DefaultReleasePolicy.
	Status func(status int) bool
	// StoreUnrouted stores and replays a response no application route produced
	// (a ServeMux's own 404 or 405, or anything wrapped with Unrouted) like a
	// handler's answer. false (the default): such a response releases the claim,
	// so a client whose first try had the wrong method or path can send the
	// corrected request with the same key.
	StoreUnrouted bool

	set fields
}

// WithRelease sets which answers release the claim (see ReleaseRule; its zero
// fields keep their settings).
func WithRelease(r ReleaseRule) Option {
	return func(c *config) {
		if r.set.sets(field1, r.Status != nil) {
			c.release = r.Status
		}
		if r.set.sets(field2, r.StoreUnrouted) {
			c.releaseUnrouted = !r.StoreUnrouted
		}
	}
}

// StoreFailureRule says how long the store may take and what a request gets when
// it fails (WithStoreFailure).
type StoreFailureRule struct {
	// Timeouts are the deadlines of the store calls (see StoreTimeouts; its zero
	// fields are the defaults, negative ones make New fail; a zero StoreTimeouts
	// keeps the setting). A hung store then answers 503 within the Claim bound
	// instead of holding the request for the client's whole timeout. Stores that
	// never wait on I/O (store.InProcess, the memory store) run without deadlines.
	Timeouts StoreTimeouts
	// RetryAfter is the Retry-After of the 503 answered when the store fails,
	// sent in whole seconds, rounded down as every Retry-After the middleware
	// sends, and at least 1. 0: DefaultStoreRetryAfter (1 s). New refuses a
	// negative one.
	RetryAfter time.Duration
	// FailOpen runs the handler unprotected when the store cannot answer a claim,
	// instead of the default 503 store_unavailable (fail closed). The key is still
	// in the request context, so an idempotent write downstream still
	// deduplicates. A store that answers but is full (store.ErrFull) is still
	// answered 503: a flood of new keys must not turn the protection off.
	FailOpen bool

	set fields
}

// WithStoreFailure sets the store calls' deadlines and the answer when the store
// fails (see StoreFailureRule; its zero fields keep their settings).
func WithStoreFailure(s StoreFailureRule) Option {
	return func(c *config) {
		if s.set.sets(field1, s.Timeouts != StoreTimeouts{}) {
			c.timeouts = s.Timeouts
		}
		if s.set.sets(field2, s.RetryAfter != 0) {
			c.storeRetryAfter = s.RetryAfter
		}
		if s.set.sets(field3, s.FailOpen) {
			c.failOpen = s.FailOpen
		}
	}
}

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

	set fields
}

// WithProblems sets the type base and extension members of the middleware's
// problems (see ProblemRule; its zero fields keep their settings).
func WithProblems(p ProblemRule) Option {
	return func(c *config) {
		if p.set.sets(field1, p.TypeBase != "") {
			c.typeBase = p.TypeBase
		}
		if p.set.sets(field2, p.Members != nil) {
			c.problemMembers = p.Members
		}
	}
}
