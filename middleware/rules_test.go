package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store/memory"
)

// TestNewRefusesInvalidRules: a value of a rule that is not zero and invalid
// makes New fail, for each rule option; the rule's zero value is the defaults.
func TestNewRefusesInvalidRules(t *testing.T) {
	for name, o := range map[string]Option{
		"key header with a space":         WithKey(policy.KeyRule{Header: "Idempotency Key"}),
		"key header with a colon":         WithKey(policy.KeyRule{Header: "Idempotency-Key:"}),
		"fingerprint body limit negative": WithRequestFingerprint(FingerprintRule{MaxBody: -1}),
		"fingerprint rule without an id":  WithRequestFingerprint(FingerprintRule{Body: &fingerprint.Rule{}}),
		"retention negative":              WithRecordRetention(policy.RetentionRule{Default: -time.Hour}),
		"retention under the lease":       WithRecordRetention(policy.RetentionRule{Default: time.Second}),
		"max retention negative":          WithRecordRetention(policy.RetentionRule{Max: -time.Hour}),
		"max retention under retention":   WithRecordRetention(policy.RetentionRule{Default: 2 * time.Hour, Max: time.Hour}),
		"replay allow list bad name":      WithReplay(ReplayRule{Headers: []string{"Location", "X Bad"}}),
		"replay allow list empty name":    WithReplay(ReplayRule{Headers: []string{""}}),
		"replay deny list bad name":       WithReplay(ReplayRule{DenyHeaders: []string{"X-Rate:"}}),
		"stored body cap negative":        WithReplay(ReplayRule{MaxBody: -1}),
		"replayed header not a token":     WithReplay(ReplayRule{ReplayedHeader: "Replayed\r\nX"}),
		"omitted header not a token":      WithReplay(ReplayRule{OmittedHeader: "a b"}),
		"store timeout negative":          WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: -time.Second}}),
		"store Retry-After negative":      WithStoreFailure(policy.StoreFailureRule{RetryAfter: -time.Second}),
		"problem type base relative":      WithProblems(ProblemRule{TypeBase: "/problems/"}),
		"problem members naming code": WithProblems(ProblemRule{Members: func(string, string) map[string]any {
			return map[string]any{"Code": 1}
		}}),
		"wait negative": WithWaitInFlight(-time.Second),
	} {
		if m, err := New(memory.New(), GlobalScope, o); err == nil || m != nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	zero := []Option{WithKey(policy.KeyRule{}), WithRequestFingerprint(FingerprintRule{}), WithRecordRetention(policy.RetentionRule{}),
		WithReplay(ReplayRule{}), WithRelease(ReleaseRule{}), WithStoreFailure(policy.StoreFailureRule{}), WithProblems(ProblemRule{}),
		WithClock(nil), WithMethods()}
	c := defaultConfig()
	for _, o := range zero {
		o(&c)
	}
	if d := diffConfig(reflect.ValueOf(c), reflect.ValueOf(defaultConfig()), "config"); d != "" {
		t.Fatalf("zero rules changed the defaults: %s", d)
	}
	if _, err := New(memory.New(), GlobalScope, zero...); err != nil {
		t.Fatalf("zero rules: %v", err)
	}
}

// TestLaterOptionWins: an option sets its whole decision, so a later one
// replaces an earlier one field by field, back to the default included (a zero
// field is the default, never "keep").
func TestLaterOptionWins(t *testing.T) {
	c := defaultConfig()
	for _, o := range []Option{
		WithKey(policy.KeyRule{Header: "X-Key", Optional: true}), WithKey(policy.KeyRule{}),
		WithLease(time.Minute), WithLease(0),
		WithRecordRetention(policy.RetentionRule{Default: time.Hour, Max: 2 * time.Hour}), WithRecordRetention(policy.RetentionRule{}),
		WithStoreFailure(policy.StoreFailureRule{FailOpen: true, RetryAfter: 9 * time.Second}), WithStoreFailure(policy.StoreFailureRule{}),
		WithWaitInFlight(time.Second), WithWaitInFlight(0),
		WithReplay(ReplayRule{DenyHeaders: []string{"X-A"}, MaxBody: 9, ReplayedHeader: "X-R"}), WithReplay(ReplayRule{DenyHeaders: []string{"X-B"}}),
		WithRelease(ReleaseRule{StoreUnrouted: true, Status: func(int) bool { return false }}), WithRelease(ReleaseRule{}),
		WithRequestFingerprint(FingerprintRule{CanonicalJSON: true, MaxBody: 5}), WithRequestFingerprint(FingerprintRule{}),
		WithProblems(ProblemRule{TypeBase: "https://example.com/p/"}), WithProblems(ProblemRule{}),
	} {
		o(&c)
	}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	d := defaultConfig()
	if err := d.validate(); err != nil {
		t.Fatal(err)
	}
	d.deny = []string{"X-B"}
	if diff := diffConfig(reflect.ValueOf(c), reflect.ValueOf(d), "config"); diff != "" {
		t.Fatalf("the later options did not restore the defaults: %s", diff)
	}
}

// TestPolicyIsWholeDecisions: WithPolicy sets every shared decision, and a later
// WithPolicy or single option replaces what it set.
func TestPolicyIsWholeDecisions(t *testing.T) {
	c := defaultConfig()
	WithPolicy(policy.Config{Key: policy.KeyRule{Optional: true}, Lease: time.Minute, WaitInFlight: time.Second})(&c)
	WithKey(policy.KeyRule{Header: "X-Key"})(&c)
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if !c.required || c.keyHeader != "X-Key" || c.lease != time.Minute || c.wait != time.Second {
		t.Fatalf("required %v header %q lease %v wait %v", c.required, c.keyHeader, c.lease, c.wait)
	}
	WithPolicy(policy.Config{})(&c)
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if !c.required || c.keyHeader != policy.DefaultKeyHeader || c.lease != claim.DefaultLease || c.wait != 0 {
		t.Fatalf("after WithPolicy(policy.Config{}): required %v header %q lease %v wait %v", c.required, c.keyHeader, c.lease, c.wait)
	}
}

// TestNewNamesTheBadField: New's error names the field whose value it refuses.
func TestNewNamesTheBadField(t *testing.T) {
	for field, o := range map[string]Option{
		"StoreFailure.RetryAfter":     WithStoreFailure(policy.StoreFailureRule{RetryAfter: -time.Second}),
		"StoreFailure.Timeouts.Claim": WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: -1}}),
		"Key.Header":                  WithKey(policy.KeyRule{Header: "a b"}),
		"Lease":                       WithLease(time.Millisecond),
		"Retention.Max":               WithRecordRetention(policy.RetentionRule{Max: time.Minute}),
		"WaitInFlight":                WithWaitInFlight(-1),
		"FingerprintRule.MaxBody":     WithRequestFingerprint(FingerprintRule{MaxBody: -1}),
		"ReplayRule.MaxBody":          WithReplay(ReplayRule{MaxBody: -1}),
		"ReplayRule.ReplayedHeader":   WithReplay(ReplayRule{ReplayedHeader: "a b"}),
	} {
		if _, err := New(memory.New(), GlobalScope, o); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: New's error %v does not name it", field, err)
		}
	}
}

// TestFailOpenTurnedOffFailsClosed: a configuration that turned fail-open on
// and then off again (a per-route override of a shared default) answers 503
// during an outage and does not run the handler.
func TestFailOpenTurnedOffFailsClosed(t *testing.T) {
	e := newEnv(t, echoHandler,
		WithStoreFailure(policy.StoreFailureRule{FailOpen: true}), WithStoreFailure(policy.StoreFailureRule{FailOpen: false}))
	e.st.claimErr = errors.New("store down")
	if w := e.do(req("POST", "/x", "k", "b")); w.Code != http.StatusServiceUnavailable || e.calls.Load() != 0 {
		t.Fatalf("%d after %d calls; want 503 and the handler not run", w.Code, e.calls.Load())
	}
	base := policy.Config{StoreFailure: policy.StoreFailureRule{FailOpen: true}}
	route := base
	route.StoreFailure.FailOpen = false
	e = newEnv(t, echoHandler, WithPolicy(base), WithPolicy(route))
	e.st.claimErr = errors.New("store down")
	if w := e.do(req("POST", "/x", "k", "b")); w.Code != http.StatusServiceUnavailable || e.calls.Load() != 0 {
		t.Fatalf("WithPolicy: %d after %d calls; want 503 and the handler not run", w.Code, e.calls.Load())
	}
}

// diffConfig names the first field where two configs differ ("" if none).
func diffConfig(a, b reflect.Value, path string) string {
	switch a.Kind() {
	case reflect.Struct:
		for i := range a.NumField() {
			if d := diffConfig(a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name); d != "" {
				return d
			}
		}
	case reflect.Slice:
		if a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return fmt.Sprintf("%s: %d items (nil %v) vs %d (nil %v)", path, a.Len(), a.IsNil(), b.Len(), b.IsNil())
		}
		for i := range a.Len() {
			if d := diffConfig(a.Index(i), b.Index(i), fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
	case reflect.Func, reflect.Pointer:
		if a.Pointer() != b.Pointer() {
			return path + ": another value"
		}
	case reflect.Interface:
		if a.IsNil() || b.IsNil() {
			if a.IsNil() != b.IsNil() {
				return path + ": nil on one side"
			}
			return ""
		}
		return diffConfig(a.Elem(), b.Elem(), path)
	case reflect.String:
		if a.String() != b.String() {
			return fmt.Sprintf("%s: %q vs %q", path, a.String(), b.String())
		}
	case reflect.Bool:
		if a.Bool() != b.Bool() {
			return fmt.Sprintf("%s: %v vs %v", path, a.Bool(), b.Bool())
		}
	case reflect.Int, reflect.Int64:
		if a.Int() != b.Int() {
			return fmt.Sprintf("%s: %d vs %d", path, a.Int(), b.Int())
		}
	default:
		return path + ": kind " + a.Kind().String() + " not compared"
	}
	return ""
}
