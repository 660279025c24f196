package middleware

import (
	"fmt"
	"github.com/idemkey/idemkey/claim"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/store/memory"
)

// TestNewRefusesInvalidRules: a value of a rule that is not zero and invalid
// makes New fail, for each rule option; the rule's zero value is the defaults.
func TestNewRefusesInvalidRules(t *testing.T) {
	for name, o := range map[string]Option{
		"key header with a space":         WithKey(KeyRule{Header: "Idempotency Key"}),
		"key header with a colon":         WithKey(KeyRule{Header: "Idempotency-Key:"}),
		"fingerprint body limit negative": WithRequestFingerprint(FingerprintRule{MaxBody: -1}),
		"fingerprint rule without an id":  WithRequestFingerprint(FingerprintRule{Body: &fingerprint.Rule{}}),
		"retention negative":              WithRecordRetention(RetentionRule{Default: -time.Hour}),
		"retention under the lease":       WithRecordRetention(RetentionRule{Default: time.Second}),
		"max retention negative":          WithRecordRetention(RetentionRule{Max: -time.Hour}),
		"max retention under retention":   WithRecordRetention(RetentionRule{Default: 2 * time.Hour, Max: time.Hour}),
		"replay allow list bad name":      WithReplay(ReplayRule{Headers: []string{"Location", "X Bad"}}),
		"replay allow list empty name":    WithReplay(ReplayRule{Headers: []string{""}}),
		"replay deny list bad name":       WithReplay(ReplayRule{DenyHeaders: []string{"X-Rate:"}}),
		"stored body cap negative":        WithReplay(ReplayRule{MaxBody: -1}),
		"replayed header not a token":     WithReplay(ReplayRule{ReplayedHeader: "Replayed\r\nX"}),
		"omitted header not a token":      WithReplay(ReplayRule{OmittedHeader: "a b"}),
		"store timeout negative":          WithStoreFailure(StoreFailureRule{Timeouts: claim.Timeouts{Claim: -time.Second}}),
		"store Retry-After negative":      WithStoreFailure(StoreFailureRule{RetryAfter: -time.Second}),
		"problem type base relative":      WithProblems(ProblemRule{TypeBase: "/problems/"}),
		"problem members naming code": WithProblems(ProblemRule{Members: func(string, string) map[string]any {
			return map[string]any{"Code": 1}
		}}),
		"wait negative": WithWaitInFlight(-time.Second),
		"no method":     WithMethods(),
		"lease zero":    WithLease(0),
		"nil clock":     WithClock(nil),
	} {
		if m, err := New(memory.New(), GlobalScope, o); err == nil || m != nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	zero := []Option{WithKey(KeyRule{}), WithRequestFingerprint(FingerprintRule{}), WithRecordRetention(RetentionRule{}),
		WithReplay(ReplayRule{}), WithRelease(ReleaseRule{}), WithStoreFailure(StoreFailureRule{}), WithProblems(ProblemRule{})}
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

// TestRulesMerge: a rule's zero fields keep what an earlier option of its kind
// set; deny lists add up.
func TestRulesMerge(t *testing.T) {
	c := defaultConfig()
	for _, o := range []Option{
		WithKey(KeyRule{Header: "X-Key"}), WithKey(KeyRule{Optional: true}),
		WithReplay(ReplayRule{DenyHeaders: []string{"X-A"}}), WithReplay(ReplayRule{DenyHeaders: []string{"X-B"}, MaxBody: 9}),
		WithRelease(ReleaseRule{StoreUnrouted: true}), WithRelease(ReleaseRule{Status: func(int) bool { return false }}),
	} {
		o(&c)
	}
	if c.keyHeader != "X-Key" || c.required || len(c.deny) != 2 || c.maxStoredBody != 9 || c.releaseUnrouted || c.release(http.StatusInternalServerError) {
		t.Fatalf("merged: header %q required %v deny %v cap %d unrouted %v", c.keyHeader, c.required, c.deny, c.maxStoredBody, c.releaseUnrouted)
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
