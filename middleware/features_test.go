package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

func mustRule(t *testing.T) func(*fingerprint.Rule, error) *fingerprint.Rule {
	return func(r *fingerprint.Rule, err error) *fingerprint.Rule {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
}

func TestFingerprintRuleIgnoresVolatileMembers(t *testing.T) {
	e := newEnv(t, echoHandler, WithRequestFingerprint(FingerprintRule{Body: mustRule(t)(fingerprint.OnlyJSONFields("/amount", "/to"))}))
	first := e.do(req("POST", "/payments?dry=0", "k1", `{"amount":5,"to":"a","sentAt":"10:00"}`))
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	retry := e.do(req("POST", "/payments?dry=0", "k1", `{"to":"a","amount":5,"sentAt":"10:05","traceId":"x"}`))
	if retry.Code != http.StatusCreated || retry.Header().Get(DefaultReplayedHeader) != "true" ||
		retry.Body.String() != first.Body.String() || e.calls.Load() != 1 {
		t.Fatalf("retry with other volatile members: %d %q %v, %d calls", retry.Code, retry.Body, retry.Header(), e.calls.Load())
	}
	checkProblem(t, e.do(req("POST", "/payments?dry=0", "k1", `{"amount":6,"to":"a"}`)), http.StatusUnprocessableEntity, CodeMismatch)
	checkProblem(t, e.do(req("POST", "/payments?dry=1", "k1", `{"amount":5,"to":"a"}`)), http.StatusUnprocessableEntity, CodeMismatch)
	checkProblem(t, e.do(req("PATCH", "/payments?dry=0", "k1", `{"amount":5,"to":"a"}`)), http.StatusUnprocessableEntity, CodeMismatch)
	checkProblem(t, e.do(req("POST", "/refunds?dry=0", "k1", `{"amount":5,"to":"a"}`)), http.StatusUnprocessableEntity, CodeMismatch)
}

func TestFingerprintRuleRefusesNonJSON(t *testing.T) {
	e := newEnv(t, echoHandler, WithRequestFingerprint(FingerprintRule{Body: mustRule(t)(fingerprint.IgnoreJSONFields("/sentAt"))}))
	for _, body := range []string{"amount=5", "", `{"amount":5`} {
		p := checkProblem(t, e.do(req("POST", "/payments", "k1", body)), http.StatusBadRequest, CodeBodyNotJSON)
		if !strings.Contains(p.Detail, "invalid JSON body at byte") {
			t.Errorf("detail %q", p.Detail)
		}
		if ev := e.lastEvent(); ev.Decision != BodyUnreadable || !errors.Is(ev.Err, fingerprint.ErrInvalidJSON) {
			t.Errorf("event %+v", ev)
		}
	}
	// Nothing was stored: the corrected request runs under the same key.
	if w := e.do(req("POST", "/payments", "k1", `{"amount":5}`)); w.Code != http.StatusCreated || e.calls.Load() != 1 {
		t.Fatalf("corrected request: %d, %d calls", w.Code, e.calls.Load())
	}
}

// notInspector hides the memory store's Inspector.
type notInspector struct{ store.Store }

// A record made under one fingerprint rule (or none) is never replayed to, nor
// re-run for, a request fingerprinted under another: 422 fingerprint_rule_changed.
func TestFingerprintRuleChanged(t *testing.T) {
	mem := memory.New()
	only := mustRule(t)(fingerprint.OnlyJSONFields("/amount"))
	ignore := mustRule(t)(fingerprint.IgnoreJSONFields("/sentAt"))
	calls := 0
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls++; w.WriteHeader(http.StatusCreated) })
	mw := func(s store.Store, opts ...Option) http.Handler {
		m, err := New(s, GlobalScope, append([]Option{WithLogger(discardLogger())}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return m.Handler(handler)
	}
	plain, withOnly, withIgnore := mw(mem), mw(mem, WithRequestFingerprint(FingerprintRule{Body: only})), mw(mem, WithRequestFingerprint(FingerprintRule{Body: ignore}))
	do := func(h http.Handler, key string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req("POST", "/payments", key, `{"amount":5}`))
		return w
	}
	if do(plain, "a").Code != http.StatusCreated || do(withOnly, "b").Code != http.StatusCreated {
		t.Fatal("first requests")
	}
	checkProblem(t, do(withOnly, "a"), http.StatusUnprocessableEntity, CodeRuleChanged)   // none -> a rule
	checkProblem(t, do(withIgnore, "b"), http.StatusUnprocessableEntity, CodeRuleChanged) // a rule -> another
	checkProblem(t, do(plain, "b"), http.StatusUnprocessableEntity, CodeMismatch)         // a rule -> none: plain 422
	if w := do(withOnly, "b"); w.Code != http.StatusCreated || w.Header().Get(DefaultReplayedHeader) != "true" {
		t.Fatalf("same rule: %d", w.Code)
	}
	// Without an Inspector the two cannot be told apart: the plain 422, still no replay.
	checkProblem(t, do(mw(notInspector{mem}, WithRequestFingerprint(FingerprintRule{Body: ignore})), "a"), http.StatusUnprocessableEntity, CodeMismatch)
	if calls != 2 {
		t.Fatalf("handler ran %d times, want 2", calls)
	}
}

func TestOnReplayHook(t *testing.T) {
	var hooked []string
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Stored", "original")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("body"))
	}, WithReplay(ReplayRule{OnReplay: func(r *http.Request, h http.Header) {
		hooked = append(hooked, r.Header.Get("X-Request-Id"))
		h.Set("X-Request-Id", r.Header.Get("X-Request-Id"))
		h["X-Stored"][0] = "scribbled" // in place: must not reach the record
		h.Add("X-Stored", "more")
		h.Set("Content-Length", "999")
		h.Del(DefaultReplayedHeader)
	}}))
	if w := e.do(req("POST", "/p", "k1", "", "X-Request-Id", "r1")); w.Code != http.StatusCreated || w.Header().Get("X-Request-Id") != "" {
		t.Fatalf("first: %d %v", w.Code, w.Header())
	}
	if len(hooked) != 0 {
		t.Fatal("hook called for an execution")
	}
	for _, id := range []string{"r2", "r3"} {
		w := e.do(req("POST", "/p", "k1", "", "X-Request-Id", id))
		if w.Code != http.StatusCreated || w.Body.String() != "body" || w.Header().Get("X-Request-Id") != id ||
			w.Header().Get(DefaultReplayedHeader) != "true" || w.Header().Get("Content-Length") != "" {
			t.Fatalf("replay %s: %d %q %v", id, w.Code, w.Body, w.Header())
		}
		if got := w.Header()["X-Stored"]; len(got) != 2 || got[0] != "scribbled" {
			t.Fatalf("replay %s: X-Stored %q", id, got)
		}
	}
	rec := e.storedRecord(t, "k1")
	if got := rec.Header["X-Stored"]; len(got) != 1 || got[0] != "original" {
		t.Fatalf("stored record changed by the hook: %q", got)
	}
	if strings.Join(hooked, ",") != "r2,r3" {
		t.Fatalf("hook saw %q", hooked)
	}
}

// storedRecord returns the record the memory store keeps for key.
func (e *env) storedRecord(t *testing.T, key string) *store.Record {
	t.Helper()
	res, err := e.mem.Claim(context.Background(), store.ClaimRequest{ID: store.ID{Scope: "anonymous", Key: key},
		Fingerprint: store.Fingerprint{1}, Lease: time.Second, Retention: time.Hour})
	if err != nil || res.Outcome != store.Mismatch {
		t.Fatalf("claim: %v %v", res.Outcome, err)
	}
	info, err := e.mem.Inspect(context.Background(), store.ID{Scope: "anonymous", Key: key})
	if err != nil || info.State != store.StateCompleted {
		t.Fatalf("inspect: %+v %v", info, err)
	}
	fpRes, err := e.mem.Claim(context.Background(), store.ClaimRequest{ID: store.ID{Scope: "anonymous", Key: key},
		Fingerprint: info.Fingerprint, Lease: time.Second, Retention: time.Hour})
	if err != nil || fpRes.Outcome != store.Completed {
		t.Fatalf("claim: %v %v", fpRes.Outcome, err)
	}
	return fpRes.Record
}

func TestReplayWithoutHookAllocatesNothing(t *testing.T) {
	m, err := New(memory.New(), GlobalScope, WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	rec := &store.Record{Response: store.Response{Status: 201, Header: http.Header{"X-A": {"1"}, "Content-Type": {"text/plain"}}, Body: []byte("b")}}
	w := &discardWriter{h: http.Header{}}
	r := httptest.NewRequest("POST", "/", nil)
	c := &call{}
	if n := testing.AllocsPerRun(100, func() { w.reset(); m.replay(w, c, r, rec) }); n != 0 { // values from a chunk: one allocation per 64
		t.Fatalf("replay without a hook: %v allocations", n)
	}
}

func TestKeyValidator(t *testing.T) {
	e := newEnv(t, echoHandler, WithKey(policy.KeyRule{Validate: policy.UUIDKeys}))
	p := checkProblem(t, e.do(req("POST", "/p", "order-42", "x")), http.StatusBadRequest, CodeKeyInvalid)
	if want := policy.UUIDKeys("order-42").Error(); p.Detail != want {
		t.Errorf("detail %q, want the validator's text", p.Detail)
	}
	if ev := e.lastEvent(); ev.Decision != KeyInvalid || ev.Err == nil {
		t.Errorf("event %+v", ev)
	}
	if w := e.do(req("POST", "/p", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "x")); w.Code != http.StatusCreated || e.calls.Load() != 1 {
		t.Fatalf("UUID key: %d, %d calls", w.Code, e.calls.Load())
	}
	custom := newEnv(t, echoHandler, WithKey(policy.KeyRule{Validate: func(key string) error {
		if len(key) < 16 {
			return errors.New("keys are at least 16 characters")
		}
		return nil
	}}))
	if p := checkProblem(t, custom.do(req("POST", "/p", "short", "x")), http.StatusBadRequest, CodeKeyInvalid); p.Detail != "keys are at least 16 characters" {
		t.Errorf("detail %q", p.Detail)
	}
	if custom.calls.Load() != 0 {
		t.Fatal("handler ran for a refused key")
	}
}

func TestProblemTypeBase(t *testing.T) {
	const base = "https://api.example.com/problems/"
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) },
		WithProblems(ProblemRule{TypeBase: base}), WithRequestFingerprint(FingerprintRule{Body: mustRule(t)(fingerprint.OnlyJSONFields("/a"))}))
	e.do(req("POST", "/p", "k1", `{"a":1}`))
	for _, tc := range []struct {
		r      *http.Request
		status int
		code   string
		link   bool
	}{
		{req("POST", "/p", "", `{"a":1}`), 400, CodeKeyMissing, true},
		{req("POST", "/p", "k1", `{"a":2}`), 422, CodeMismatch, true},
		{req("POST", "/p", `"a`, `{"a":1}`), 400, CodeKeyInvalid, false},
		{req("POST", "/p", "k2", `a=1`), 400, CodeBodyNotJSON, false},
	} {
		w := e.do(tc.r)
		var p problemBody
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != tc.status || p.Code != tc.code || p.Type != base+tc.code {
			t.Errorf("%s: %d %+v %v", tc.code, w.Code, p, err)
		}
		wantLink := ""
		if tc.link {
			wantLink = "<" + base + tc.code + `>; rel="describedby"`
		}
		if got := strings.Join(w.Header()["Link"], ","); got != wantLink {
			t.Errorf("%s: Link %q, want %q", tc.code, got, wantLink)
		}
	}
	// The default stays the URN, without Link.
	d := newEnv(t, echoHandler)
	w := d.do(req("POST", "/p", "", "x"))
	checkProblem(t, w, http.StatusBadRequest, CodeKeyMissing)
	if w.Header().Get("Link") != "" {
		t.Error("Link without a base")
	}
}

func TestProblemTypeBaseInFlightAndRuleChanged(t *testing.T) {
	const base = "https://api.example.com/p/"
	mem := memory.New()
	entered, proceed := make(chan struct{}), make(chan struct{})
	block := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-proceed
		w.WriteHeader(http.StatusCreated)
	})
	m1, _ := New(mem, GlobalScope, WithLogger(discardLogger()))
	m2, err := New(mem, GlobalScope, WithLogger(discardLogger()), WithProblems(ProblemRule{TypeBase: base}),
		WithRequestFingerprint(FingerprintRule{Body: mustRule(t)(fingerprint.OnlyJSONFields("/a"))}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		m2.Handler(block).ServeHTTP(httptest.NewRecorder(), req("POST", "/p", "k1", `{"a":1}`))
	}()
	<-entered
	w := httptest.NewRecorder()
	m2.Handler(block).ServeHTTP(w, req("POST", "/p", "k1", `{"a":1}`))
	if w.Code != http.StatusConflict || w.Header().Get("Link") != "<"+base+CodeInFlight+`>; rel="describedby"` {
		t.Errorf("409: %d Link %q", w.Code, w.Header().Get("Link"))
	}
	close(proceed)
	<-done
	m1.Handler(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), req("POST", "/p", "k2", `{"a":1}`))
	w = httptest.NewRecorder()
	m2.Handler(block).ServeHTTP(w, req("POST", "/p", "k2", `{"a":1}`))
	if w.Code != http.StatusUnprocessableEntity || w.Header().Get("Link") != "<"+base+CodeRuleChanged+`>; rel="describedby"` {
		t.Errorf("422 rule changed: %d Link %q body %s", w.Code, w.Header().Get("Link"), w.Body)
	}
}

func TestNewRefusesFeatureOptions(t *testing.T) {
	for name, opt := range map[string]Option{
		"relative base":       WithProblems(ProblemRule{TypeBase: "/problems/"}),
		"base with fragment":  WithProblems(ProblemRule{TypeBase: "https://x.example/p#"}),
		"base with space":     WithProblems(ProblemRule{TypeBase: "https://x.example/a b/"}),
		"base with quote":     WithProblems(ProblemRule{TypeBase: `https://x.example/"/`}),
		"max under retention": WithRecordRetention(policy.RetentionRule{Max: time.Hour}),
		"negative max":        WithRecordRetention(policy.RetentionRule{Max: -time.Hour}),
		"zero rule":           WithRequestFingerprint(FingerprintRule{Body: &fingerprint.Rule{}}),
	} {
		if _, err := New(memory.New(), GlobalScope, opt); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
	if _, err := New(memory.New(), GlobalScope, WithProblems(ProblemRule{TypeBase: "https://api.example.com/problems/"}), WithRecordRetention(policy.RetentionRule{Max: 48 * time.Hour})); err != nil {
		t.Errorf("valid options refused: %v", err)
	}
}
