// Package policy is the one vocabulary of the decisions every entry point makes
// about a protected call: which keys it accepts, how long a claim and a record
// last, and what a caller gets when the store fails. The HTTP middleware
// (package middleware), the gRPC interceptor (middleware/grpc) and the function
// runner (package idem) take the same Config, each reading the parts that apply
// to it (written beside each field), so a service that protects HTTP routes, gRPC
// methods and functions configures each decision once.
//
// A zero field means its documented default, never "keep what was set before":
// an entry point's option for a decision replaces that whole decision, so a later
// option always wins, back to the default included. docs/architecture.md section
// 3.1 argues the choice; section 3 is the decision table these rules feed.
//
// The package imports neither the HTTP layer (package middleware) nor gRPC, only
// claim and store: idem and the gRPC interceptor take it without them.
package policy

import (
	"fmt"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/internal/httpfield"
)

const (
	// DefaultKeyHeader is where the key is read (IETF draft
	// draft-ietf-httpapi-idempotency-key-header-07 section 2): the HTTP header of
	// that name, the gRPC metadata of its lowercase form.
	DefaultKeyHeader = "Idempotency-Key"
	// DefaultStoreRetryAfter is the delay a caller is told to wait before a retry
	// when the store failed (HTTP Retry-After, gRPC RetryInfo).
	DefaultStoreRetryAfter = time.Second
)

// Config holds the shared decisions. Its zero value is the documented default of
// every decision. Entry points validate it when they are built (New) and fail
// with an error naming the first field that is out of range.
type Config struct {
	// Key says where the key is read and which keys are accepted. Read by the
	// HTTP middleware and the gRPC interceptor; idem is given its key.
	Key KeyRule
	// Lease is how long a claim is exclusive without renewal; it is renewed every
	// third of it while the handler runs. 0: claim.DefaultLease (10 s); else at
	// least claim.MinLease (100 ms) and at most Retention.Default. Read by all.
	Lease time.Duration
	// Retention says how long records are kept and replayed. Read by all.
	Retention RetentionRule
	// StoreFailure says how long the store may take and what a caller gets when
	// it fails. Timeouts are read by all; RetryAfter by the HTTP middleware and
	// the gRPC interceptor; FailOpen by the HTTP middleware only (the gRPC
	// interceptor and idem always fail closed).
	StoreFailure StoreFailureRule
	// WaitInFlight lets a duplicate that finds its key in flight wait up to this
	// long for the original's answer instead of the immediate "in flight" answer
	// (409). 0: no waiting. Read by the HTTP middleware only (middleware
	// WithWaitInFlight documents the wait); idem and the gRPC interceptor answer
	// at once.
	WaitInFlight time.Duration
}

// KeyRule says where a key is read and which keys are accepted.
type KeyRule struct {
	// Header names the HTTP header carrying the key; the gRPC interceptor reads
	// the metadata of its lowercase form. "": DefaultKeyHeader. It must be an RFC
	// 9110 token (section 5.1): a header no request can carry would answer every
	// client 400.
	Header string
	// Optional lets a protected call without a key pass through unprotected,
	// nothing stored. false (the default): it is refused (HTTP 400
	// idempotency_key_missing, gRPC INVALID_ARGUMENT).
	Optional bool
	// Validate is a rule on keys, applied after the entry point's own syntax
	// check: a key it refuses is answered as invalid (HTTP 400
	// idempotency_key_invalid, gRPC INVALID_ARGUMENT) with the error's text as
	// the detail, so write it for the client. The IETF draft asks servers to
	// publish their key format and validate keys against it (section 5). It runs
	// on every protected call with a key, concurrently, before the claim.
	// UUIDKeys is one. nil: no rule beyond the syntax.
	Validate func(key string) error
}

// RetentionRule says how long records are kept and replayed, counted from their
// completion on the store's clock.
type RetentionRule struct {
	// Default is every record's retention. 0: claim.DefaultRetention (24 h).
	// It must be at least the lease.
	Default time.Duration
	// Max is the longest retention claim.SetRetention may give one record.
	// 0: Default, so a handler may only shorten its record's life. Else at least
	// Default.
	Max time.Duration
}

// StoreFailureRule says how long the store may take and what a caller gets when
// it cannot answer.
type StoreFailureRule struct {
	// Timeouts are the deadlines of the store calls (claim.Timeouts: a zero field
	// is its default, 5 s; none may be negative). A hung store then answers
	// "unavailable" within the claim bound instead of holding the caller for its
	// whole timeout. Stores that never wait on I/O (store.InProcess) run without
	// deadlines.
	Timeouts claim.Timeouts
	// RetryAfter is the delay sent with the "unavailable" answer (HTTP 503
	// Retry-After, in whole seconds, at least 1; gRPC UNAVAILABLE RetryInfo).
	// 0: DefaultStoreRetryAfter (1 s). Not negative.
	RetryAfter time.Duration
	// FailOpen runs the handler unprotected when the store cannot answer a claim,
	// instead of the default "unavailable" (fail closed). The key stays in the
	// request's context, so an idempotent write downstream still deduplicates. A
	// store that answers but is full (store.ErrFull) is still refused: a flood of
	// new keys must not turn the protection off. false (the default): fail closed.
	FailOpen bool
}

// Validate returns an error naming the first field of c that no entry point
// accepts (nil if none): a key header that is not an RFC 9110 token, a negative
// duration, a lease under claim.MinLease, a retention shorter than the lease, a
// maximum retention shorter than the retention, or a renewal timeout longer than
// the lease. Zero fields are valid: they are the defaults.
func (c Config) Validate() error {
	d := c.WithDefaults()
	t := c.StoreFailure.Timeouts
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"Lease", c.Lease}, {"Retention.Default", c.Retention.Default}, {"Retention.Max", c.Retention.Max},
		{"StoreFailure.RetryAfter", c.StoreFailure.RetryAfter}, {"WaitInFlight", c.WaitInFlight},
		{"StoreFailure.Timeouts.Claim", t.Claim}, {"StoreFailure.Timeouts.Complete", t.Complete},
		{"StoreFailure.Timeouts.Release", t.Release}, {"StoreFailure.Timeouts.Renew", t.Renew},
	} {
		if f.v < 0 {
			return fmt.Errorf("idemkey/policy: %s %v must not be negative", f.name, f.v)
		}
	}
	switch {
	case !httpfield.ValidName(d.Key.Header):
		return fmt.Errorf("idemkey/policy: Key.Header %q is not an RFC 9110 token (section 5.1)", c.Key.Header)
	case d.Lease < claim.MinLease:
		return fmt.Errorf("idemkey/policy: Lease %v under the minimum %v (it is renewed every third of it)", c.Lease, claim.MinLease)
	case d.Retention.Default < d.Lease:
		return fmt.Errorf("idemkey/policy: Retention.Default %v shorter than the lease %v", d.Retention.Default, d.Lease)
	case d.Retention.Max != 0 && d.Retention.Max < d.Retention.Default:
		return fmt.Errorf("idemkey/policy: Retention.Max %v shorter than Retention.Default %v", d.Retention.Max, d.Retention.Default)
	case t.Renew > d.Lease:
		return fmt.Errorf("idemkey/policy: StoreFailure.Timeouts.Renew %v longer than the lease %v (a renewal that slow cannot hold it)", t.Renew, d.Lease)
	}
	return nil
}

// WithDefaults returns c with each zero field that has a default set to it:
// Key.Header, Lease, Retention.Default and StoreFailure.RetryAfter. The other
// zero fields keep their documented meaning (Retention.Max: Default; a zero
// timeout: claim's default; WaitInFlight: no waiting).
func (c Config) WithDefaults() Config {
	if c.Key.Header == "" {
		c.Key.Header = DefaultKeyHeader
	}
	if c.Lease == 0 {
		c.Lease = claim.DefaultLease
	}
	if c.Retention.Default == 0 {
		c.Retention.Default = claim.DefaultRetention
	}
	if c.StoreFailure.RetryAfter == 0 {
		c.StoreFailure.RetryAfter = DefaultStoreRetryAfter
	}
	return c
}
