package middleware

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// This file is the one test that uses the deprecated options (deprecated.go):
// each must configure what its replacement does.

// deprecatedCases pairs each deprecated option with its replacement, with
// values that differ from the defaults, so a request shows the setting.
func deprecatedCases(t *testing.T) []struct {
	name     string
	old, new []Option
} {
	rule, err := fingerprint.OnlyJSONFields("/a")
	if err != nil {
		t.Fatal(err)
	}
	never := func(int) bool { return false }
	route := func(*http.Request) string { return "/same" }
	hook := func(_ *http.Request, h http.Header) { h.Set("X-Hook", "1") }
	members := func(code, _ string) map[string]any { return map[string]any{"error": strings.ToUpper(code)} }
	timeouts := StoreTimeouts{Claim: 3 * time.Second}
	one := func(o Option) []Option { return []Option{o} }
	small := WithReplay(ReplayRule{MaxBody: 100})
	return []struct {
		name     string
		old, new []Option
	}{
		{"WithKeyHeader", one(WithKeyHeader("x-key")), one(WithKey(KeyRule{Header: "x-key"}))},
		{"WithKeyRequired", one(WithKeyRequired(false)), one(WithKey(KeyRule{Optional: true}))},
		{"WithKeyRequired back to true", []Option{WithKeyRequired(false), WithKeyRequired(true)}, nil},
		{"WithKeyValidator", one(WithKeyValidator(UUIDKeys)), one(WithKey(KeyRule{Validate: UUIDKeys}))},
		{"WithRoute", one(WithRoute(route)), one(WithRequestFingerprint(FingerprintRule{Route: route}))},
		{"WithFingerprint", one(WithFingerprint(rule)), one(WithRequestFingerprint(FingerprintRule{Body: rule}))},
		{"WithCanonicalJSON", one(WithCanonicalJSON(true)), one(WithRequestFingerprint(FingerprintRule{CanonicalJSON: true}))},
		{"WithMaxRequestBody", one(WithMaxRequestBody(1000)), one(WithRequestFingerprint(FingerprintRule{MaxBody: 1000}))},
		{"WithRetention", one(WithRetention(time.Hour)), one(WithRecordRetention(RetentionRule{Default: time.Hour}))},
		{"WithMaxRetention", one(WithMaxRetention(48 * time.Hour)), one(WithRecordRetention(RetentionRule{Max: 48 * time.Hour}))},
		{"WithReplayHeaders", one(WithReplayHeaders("X-App")), one(WithReplay(ReplayRule{Headers: []string{"X-App"}}))},
		{"WithReplayHeaders()", one(WithReplayHeaders()), one(WithReplay(ReplayRule{Headers: []string{}}))},
		{"WithDenyHeaders", one(WithDenyHeaders("X-App")), one(WithReplay(ReplayRule{DenyHeaders: []string{"X-App"}}))},
		{"WithMaxStoredBody", one(WithMaxStoredBody(100)), one(WithReplay(ReplayRule{MaxBody: 100}))},
		{"WithReplayedHeader", one(WithReplayedHeader("Idempotency-Replayed")), one(WithReplay(ReplayRule{ReplayedHeader: "Idempotency-Replayed"}))},
		// The omitted mark shows only on a body over the cap.
		{"WithOmittedHeader", []Option{small, WithOmittedHeader("X-Omitted")}, []Option{small, WithReplay(ReplayRule{OmittedHeader: "X-Omitted"})}},
		{"WithOnReplay", one(WithOnReplay(hook)), one(WithReplay(ReplayRule{OnReplay: hook}))},
		{"WithReleasePolicy", one(WithReleasePolicy(never)), one(WithRelease(ReleaseRule{Status: never}))},
		{"WithReleaseUnrouted", one(WithReleaseUnrouted(false)), one(WithRelease(ReleaseRule{StoreUnrouted: true}))},
		{"WithStoreTimeouts", one(WithStoreTimeouts(timeouts)), one(WithStoreFailure(StoreFailureRule{Timeouts: timeouts}))},
		{"WithStoreRetryAfter", one(WithStoreRetryAfter(7 * time.Second)), one(WithStoreFailure(StoreFailureRule{RetryAfter: 7 * time.Second}))},
		{"WithFailOpen", one(WithFailOpen(true)), one(WithStoreFailure(StoreFailureRule{FailOpen: true}))},
		{"WithProblemTypeBase", one(WithProblemTypeBase("https://api.example.com/p/")), one(WithProblems(ProblemRule{TypeBase: "https://api.example.com/p/"}))},
		{"WithProblemMembers", one(WithProblemMembers(members)), one(WithProblems(ProblemRule{Members: members}))},
	}
}

// TestDeprecatedOptionsConfigureTheSame: each deprecated option leaves the
// configuration its replacement leaves, and the requests of a script get the
// same answers; the answers differ from the defaults' (the setting shows).
func TestDeprecatedOptionsConfigureTheSame(t *testing.T) {
	defaults := transcript(t)
	for _, c := range deprecatedCases(t) {
		t.Run(c.name, func(t *testing.T) {
			base := defaults
			old, new := defaultConfig(), defaultConfig()
			for _, o := range c.old {
				o(&old)
			}
			for _, o := range c.new {
				o(&new)
			}
			if d := diffConfig(reflect.ValueOf(old), reflect.ValueOf(new), "config"); d != "" {
				t.Fatalf("configurations differ: %s", d)
			}
			got := transcript(t, c.old...)
			if want := transcript(t, c.new...); got != want {
				t.Fatalf("answers differ\nold: %s\nnew: %s", got, want)
			}
			if c.name == "WithOmittedHeader" {
				base = transcript(t, c.new[0])
			}
			if (got == base) != (c.new == nil) {
				t.Fatalf("answers equal to the defaults' %v:\n%s", got == base, got)
			}
		})
	}
	// WithPrincipal is ContextWithPrincipal.
	p, _ := PrincipalFromContext(WithPrincipal(context.Background(), "alice"))
	if p != "alice" {
		t.Fatalf("WithPrincipal: principal %q", p)
	}
}

// TestDeprecatedExplicitValuesStillFail: the explicit values of the deprecated
// options that New refused in v0.1.0 are still refused, although the zero
// field of a rule means its default.
func TestDeprecatedExplicitValuesStillFail(t *testing.T) {
	for name, o := range map[string]Option{
		"WithKeyHeader(\"\")":        WithKeyHeader(""),
		"WithReplayedHeader(\"\")":   WithReplayedHeader(""),
		"WithOmittedHeader(\"\")":    WithOmittedHeader(""),
		"WithRoute(nil)":             WithRoute(nil),
		"WithReleasePolicy(nil)":     WithReleasePolicy(nil),
		"WithRetention(0)":           WithRetention(0),
		"WithMaxRequestBody(-1)":     WithMaxRequestBody(-1),
		"WithMaxStoredBody(-1)":      WithMaxStoredBody(-1),
		"WithStoreRetryAfter(-1s)":   WithStoreRetryAfter(-time.Second),
		"WithDenyHeaders(\"a b\")":   WithDenyHeaders("a b"),
		"WithReplayHeaders(\"\")":    WithReplayHeaders(""),
		"WithMaxRetention(-1h)":      WithMaxRetention(-time.Hour),
		"WithProblemTypeBase(\"/\")": WithProblemTypeBase("/"),
	} {
		if m, err := New(memory.New(), GlobalScope, o); err == nil || m != nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

// diffConfig compares two configurations field by field, functions by their
// code pointer; "" when they agree.
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

// scriptStore fails claims of the key "down" and records the claim deadline
// of the key "deadline" (it is no store.InProcess, so calls are bounded).
type scriptStore struct {
	store.Store
	claimBound time.Duration
}

func (s *scriptStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if d, ok := ctx.Deadline(); ok && req.ID.Key == "deadline" {
		s.claimBound = time.Until(d).Round(time.Second)
	}
	if req.ID.Key == "down" {
		return store.ClaimResult{}, errors.New("down (injected)")
	}
	return s.Store.Claim(ctx, req)
}

// transcript runs a script of requests through a middleware with opts and
// returns what they got: each answer's status, headers and body.
func transcript(t *testing.T, opts ...Option) string {
	t.Helper()
	st := &scriptStore{Store: memory.New()}
	mux := http.NewServeMux()
	app := func(w http.ResponseWriter, r *http.Request) {
		id, _ := KeyFromContext(r.Context())
		_ = SetRetention(r.Context(), 100*time.Hour)
		c, _ := ClaimFromContext(r.Context())
		w.Header().Set("X-App", "1")
		w.Header().Set("X-Other", "1")
		var status int
		fmt.Sscan(r.Header.Get("X-Status"), &status)
		w.WriteHeader(max(status, http.StatusCreated))
		fmt.Fprintf(w, "key=%s retention=%v %s", id.Key, c.Retention, strings.Repeat("x", len(r.Header.Get("X-Big"))*200))
	}
	mux.HandleFunc("POST /a", app)
	mux.HandleFunc("POST /b", app)
	m, err := New(st, GlobalScope, append([]Option{WithLogger(discardLogger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	send := func(path, key, body string, headers ...string) {
		r := httptest.NewRequest("POST", path, strings.NewReader(body))
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
			r.Header.Set("X-Key", "x-"+key)
		}
		for i := 0; i+1 < len(headers); i += 2 {
			r.Header.Set(headers[i], headers[i+1])
		}
		w := httptest.NewRecorder()
		m.Handler(mux).ServeHTTP(w, r)
		names := make([]string, 0, len(w.Header()))
		for n := range w.Header() {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(&out, "%s %s %d", path, key, w.Code)
		for _, n := range names {
			fmt.Fprintf(&out, " %s=%q", n, w.Header()[n])
		}
		fmt.Fprintf(&out, " %s\n", w.Body)
	}
	send("/a", "k1", `{"a":1,"b":2}`)
	send("/a", "k1", `{"a":1,"b":2}`) // replay: marks, headers, hook
	send("/a", "k1", `{"b":2,"a":1}`) // canonical JSON
	send("/a", "k1", `{"a":1,"b":3}`) // body rule
	send("/b", "k1", `{"a":1,"b":2}`) // route
	send("/a", "", `{}`)              // key required, problems
	send("/a", "k2", strings.Repeat("y", 1500))
	send("/a", "k3", `{}`, "X-Status", "500")
	send("/a", "k3", `{}`, "X-Status", "500") // release policy
	send("/nowhere", "k4", `{}`)
	send("/nowhere", "k4", `{}`) // unrouted
	send("/a", "k5", `{}`, "X-Big", "x")
	send("/a", "k5", `{}`, "X-Big", "x") // storage cap, omitted mark
	send("/a", "8e03978e-40d5-43e8-bc93-6894a57f9324", `{}`)
	send("/a", "down", `{}`) // fail open, Retry-After
	send("/a", "deadline", `{}`)
	fmt.Fprintf(&out, "claim bound %v\n", st.claimBound)
	return out.String()
}
