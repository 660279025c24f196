package middleware

import (
	"context"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/fingerprint"
)

// The options of v0.1.0 that the rule options replace (docs/options.md, "From
// v0.1.0"). Each sets one field of its rule, a zero value included, exactly as
// it did; they are removed in the next minor release.

// Deprecated: use WithKey(KeyRule{Header: name}).
func WithKeyHeader(name string) Option { return WithKey(KeyRule{Header: name, set: field1}) }

// Deprecated: use WithKey(KeyRule{Optional: !required}).
func WithKeyRequired(required bool) Option { return WithKey(KeyRule{Optional: !required, set: field2}) }

// Deprecated: use WithKey(KeyRule{Validate: validate}).
func WithKeyValidator(validate func(key string) error) Option {
	return WithKey(KeyRule{Validate: validate, set: field3})
}

// Deprecated: use WithRequestFingerprint(FingerprintRule{Route: f}).
func WithRoute(f func(*http.Request) string) Option {
	return WithRequestFingerprint(FingerprintRule{Route: f, set: field1})
}

// Deprecated: use WithRequestFingerprint(FingerprintRule{Body: rule}).
func WithFingerprint(rule *fingerprint.Rule) Option {
	return WithRequestFingerprint(FingerprintRule{Body: rule, set: field2})
}

// Deprecated: use WithRequestFingerprint(FingerprintRule{CanonicalJSON: on}).
func WithCanonicalJSON(on bool) Option {
	return WithRequestFingerprint(FingerprintRule{CanonicalJSON: on, set: field3})
}

// Deprecated: use WithRequestFingerprint(FingerprintRule{MaxBody: n}).
func WithMaxRequestBody(n int64) Option {
	return WithRequestFingerprint(FingerprintRule{MaxBody: n, set: field4})
}

// Deprecated: use WithRecordRetention(RetentionRule{Default: d}).
func WithRetention(d time.Duration) Option {
	return WithRecordRetention(RetentionRule{Default: d, set: field1})
}

// Deprecated: use WithRecordRetention(RetentionRule{Max: d}).
func WithMaxRetention(d time.Duration) Option {
	return WithRecordRetention(RetentionRule{Max: d, set: field2})
}

// Deprecated: use WithReplay(ReplayRule{Headers: names}).
func WithReplayHeaders(names ...string) Option {
	return WithReplay(ReplayRule{Headers: names, set: field1})
}

// Deprecated: use WithReplay(ReplayRule{DenyHeaders: names}).
func WithDenyHeaders(names ...string) Option { return WithReplay(ReplayRule{DenyHeaders: names}) }

// Deprecated: use WithReplay(ReplayRule{MaxBody: n}).
func WithMaxStoredBody(n int) Option { return WithReplay(ReplayRule{MaxBody: n, set: field3}) }

// Deprecated: use WithReplay(ReplayRule{ReplayedHeader: name}).
func WithReplayedHeader(name string) Option {
	return WithReplay(ReplayRule{ReplayedHeader: name, set: field4})
}

// Deprecated: use WithReplay(ReplayRule{OmittedHeader: name}).
func WithOmittedHeader(name string) Option {
	return WithReplay(ReplayRule{OmittedHeader: name, set: field5})
}

// Deprecated: use WithReplay(ReplayRule{OnReplay: hook}).
func WithOnReplay(hook func(r *http.Request, h http.Header)) Option {
	return WithReplay(ReplayRule{OnReplay: hook, set: field6})
}

// Deprecated: use WithRelease(ReleaseRule{Status: release}).
func WithReleasePolicy(release func(status int) bool) Option {
	return WithRelease(ReleaseRule{Status: release, set: field1})
}

// Deprecated: use WithRelease(ReleaseRule{StoreUnrouted: !on}).
func WithReleaseUnrouted(on bool) Option {
	return WithRelease(ReleaseRule{StoreUnrouted: !on, set: field2})
}

// Deprecated: use WithStoreFailure(StoreFailureRule{Timeouts: t}).
func WithStoreTimeouts(t StoreTimeouts) Option {
	return WithStoreFailure(StoreFailureRule{Timeouts: t, set: field1})
}

// Deprecated: use WithStoreFailure(StoreFailureRule{RetryAfter: d}).
func WithStoreRetryAfter(d time.Duration) Option {
	return WithStoreFailure(StoreFailureRule{RetryAfter: d, set: field2})
}

// Deprecated: use WithStoreFailure(StoreFailureRule{FailOpen: on}).
func WithFailOpen(on bool) Option {
	return WithStoreFailure(StoreFailureRule{FailOpen: on, set: field3})
}

// Deprecated: use WithProblems(ProblemRule{TypeBase: base}).
func WithProblemTypeBase(base string) Option {
	return WithProblems(ProblemRule{TypeBase: base, set: field1})
}

// Deprecated: use WithProblems(ProblemRule{Members: members}).
func WithProblemMembers(members func(code, detail string) map[string]any) Option {
	return WithProblems(ProblemRule{Members: members, set: field2})
}

// WithPrincipal is ContextWithPrincipal, under the name it had among the
// options although it is none.
//
// Deprecated: use ContextWithPrincipal.
func WithPrincipal(ctx context.Context, principal string) context.Context {
	return ContextWithPrincipal(ctx, principal)
}
