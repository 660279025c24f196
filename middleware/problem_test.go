package middleware

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// TestProblemMembers: with ProblemRule.Members every problem the middleware
// answers carries the extra members (here the reference page's "error" and
// "message") after its own five, which stay as they were.
func TestProblemMembers(t *testing.T) {
	members := func(code, detail string) map[string]any {
		return map[string]any{"message": detail, "error": strings.ToUpper(code)}
	}
	hs := &hookStore{Store: memory.New()}
	m, err := New(hs, ScopeFromHeader("X-Client-ID", "anonymous"), WithProblems(ProblemRule{Members: members}),
		WithRequestFingerprint(FingerprintRule{MaxBody: 8}), WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	gate, started := make(chan struct{}), make(chan struct{})
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-gate
		}
		w.WriteHeader(http.StatusCreated)
	}))
	do := func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	done := make(chan struct{})
	go func() { defer close(done); do(req("POST", "/slow", "held", "b")) }()
	<-started // the slow request holds its key
	do(req("POST", "/x", "used", "b"))
	unreadable := httptest.NewRequest("POST", "/x", io.MultiReader(strings.NewReader("part"), errReader{}))
	unreadable.Header.Set("Idempotency-Key", "u")
	for _, tc := range []struct {
		name string
		r    *http.Request
		code string
		down bool
	}{
		{"missing", req("POST", "/x", "", "b"), CodeKeyMissing, false},
		{"invalid", req("POST", "/x", `"open`, "b"), CodeKeyInvalid, false},
		{"scope", req("POST", "/x", "k", "b", "X-Client-ID", strings.Repeat("c", store.MaxScopeLen+1)), CodeScopeInvalid, false},
		{"too large", req("POST", "/x", "k", "123456789"), CodeRequestTooLarge, false},
		{"unreadable", unreadable, CodeBodyUnreadable, false},
		{"in flight", req("POST", "/slow", "held", "b"), CodeInFlight, false},
		{"mismatch", req("POST", "/x", "used", "other"), CodeMismatch, false},
		{"store down", req("POST", "/x", "new", "b"), CodeStoreUnavailable, true},
	} {
		if tc.down {
			hs.claimErr = errors.New("down")
		}
		w := do(tc.r)
		var p map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatalf("%s: %v: %s", tc.name, err, w.Body)
		}
		if p["code"] != tc.code || p["type"] != ProblemTypePrefix+tc.code || p["error"] != strings.ToUpper(tc.code) ||
			p["message"] != p["detail"] || p["detail"] == "" || p["title"] == "" || p["status"] != float64(w.Code) || len(p) != 7 {
			t.Errorf("%s: %d %s", tc.name, w.Code, w.Body)
		}
		if !strings.HasPrefix(w.Body.String(), `{"type":`) || !strings.HasSuffix(w.Body.String(), "}\n") {
			t.Errorf("%s: body %q: the problem's own members first, one line", tc.name, w.Body)
		}
	}
	close(gate)
	<-done
}

// TestProblemMembersRefused: members that could not be rendered on every
// problem fail New, not a request.
func TestProblemMembersRefused(t *testing.T) {
	for name, members := range map[string]func(code, detail string) map[string]any{
		"reserved name": func(code, _ string) map[string]any { return map[string]any{"detail": "x"} },
		"reserved on one code": func(code, _ string) map[string]any {
			if code == CodeRequestTooLarge {
				return map[string]any{"status": 500}
			}
			return nil
		},
		"reserved name in another case": func(string, string) map[string]any { return map[string]any{"Code": "x"} },
		"not JSON":                      func(string, string) map[string]any { return map[string]any{"f": func() {}} },
		"panics":                        func(string, string) map[string]any { panic("boom") },
	} {
		if m, err := New(memory.New(), GlobalScope, WithProblems(ProblemRule{Members: members})); err == nil || m != nil {
			t.Errorf("%s: New = %v, %v; want an error", name, m, err)
		}
	}
	// nil and empty maps add nothing.
	for _, members := range []func(code, detail string) map[string]any{
		nil, func(string, string) map[string]any { return nil }, func(string, string) map[string]any { return map[string]any{} },
	} {
		m, err := New(memory.New(), GlobalScope, WithProblems(ProblemRule{Members: members}))
		if err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		m.Handler(http.NotFoundHandler()).ServeHTTP(w, req("POST", "/x", "", "b"))
		var p map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || len(p) != 5 {
			t.Errorf("members %v: %s", p, w.Body)
		}
	}
}

// TestProblemMembersFailingLater: a members function that fails only on a
// detail New did not try (here a panic, and a reserved name, for the 413's
// detail) leaves that problem whole, without extension members.
func TestProblemMembersFailingLater(t *testing.T) {
	for name, members := range map[string]func(code, detail string) map[string]any{
		"panics": func(_, detail string) map[string]any {
			if strings.Contains(detail, "larger than") {
				panic("boom")
			}
			return map[string]any{"error": "E"}
		},
		"reserved": func(_, detail string) map[string]any {
			if strings.Contains(detail, "larger than") {
				return map[string]any{"status": 500}
			}
			return map[string]any{"error": "E"}
		},
	} {
		m, err := New(memory.New(), GlobalScope, WithProblems(ProblemRule{Members: members}), WithRequestFingerprint(FingerprintRule{MaxBody: 4}))
		if err != nil {
			t.Fatalf("%s: New: %v", name, err)
		}
		w := httptest.NewRecorder()
		m.Handler(http.NotFoundHandler()).ServeHTTP(w, req("POST", "/x", "k", "too large"))
		var p map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != http.StatusRequestEntityTooLarge ||
			p["code"] != CodeRequestTooLarge || p["status"] != float64(413) || len(p) != 5 {
			t.Errorf("%s: %d %q (%v)", name, w.Code, w.Body, err)
		}
	}
}

// TestHeaderValuesNotShared: an outer middleware that edits the header values
// of a response in place once it is written (the replay mark, a problem's
// Content-Type and Retry-After) changes that response only: the next replay and
// the next 409 still carry the middleware's values.
func TestHeaderValuesNotShared(t *testing.T) {
	entered, proceed := make(chan struct{}), make(chan struct{})
	e := newEnvHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if string(b) == "slow" {
			entered <- struct{}{}
			<-proceed
		}
		w.WriteHeader(http.StatusCreated)
		w.Write(b)
	}), WithReplay(ReplayRule{MaxBody: 1}))
	inner := e.h
	e.h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner.ServeHTTP(w, r)
		for _, v := range w.Header() {
			for i := range v {
				v[i] = "edited" // in place, after the recorder took its snapshot
			}
		}
	})
	check := func(w *httptest.ResponseRecorder, status int, want map[string]string) {
		t.Helper()
		if w.Code != status {
			t.Fatalf("status %d, want %d", w.Code, status)
		}
		for k, v := range want {
			if got := w.Result().Header.Get(k); got != v {
				t.Errorf("%s: %q, want %q", k, got, v)
			}
		}
	}
	e.do(req("POST", "/charges", "a", "x"))
	e.do(req("POST", "/charges", "o", "long body"))
	for range 2 {
		check(e.do(req("POST", "/charges", "a", "x")), http.StatusCreated, map[string]string{"Idempotent-Replayed": "true"})
		check(e.do(req("POST", "/charges", "o", "long body")), http.StatusCreated,
			map[string]string{"Idempotent-Replayed": "true", DefaultOmittedHeader: "omitted"})
	}
	done := make(chan struct{})
	go func() { defer close(done); e.do(req("POST", "/charges", "s", "slow")) }()
	<-entered
	for range 2 {
		w := e.do(req("POST", "/charges", "s", "slow"))
		check(w, http.StatusConflict, map[string]string{"Content-Type": ProblemContentType, "Cache-Control": "no-store"})
		if ra := w.Result().Header.Get("Retry-After"); ra == "" || ra == "edited" {
			t.Errorf("Retry-After %q, want seconds", ra)
		}
	}
	close(proceed)
	<-done
}
