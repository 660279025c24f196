package middleware

import (
	"net/http"
	"strings"
	"testing"
)

// TestScopeHeaderOnSeveralLines: a scope header sent on several lines (two or
// more, equal or not, one of them empty) names no one principal; it is refused
// 400 idempotency_scope_invalid before the store is asked, as a key on several
// lines is, instead of taking the first line.
func TestScopeHeaderOnSeveralLines(t *testing.T) {
	for _, lines := range [][]string{
		{"alice", "bob"},
		{"alice", "alice"},
		{"", "alice"},
		{"alice", ""},
		{"a", "b", "c"},
		{"anonymous", "anonymous"},
	} {
		t.Run(strings.Join(lines, ","), func(t *testing.T) {
			e := newEnv(t, echoHandler)
			r := req("POST", "/pay", "k1", "{}")
			r.Header["X-Client-Id"] = lines
			w := e.do(r)
			checkProblem(t, w, http.StatusBadRequest, CodeScopeInvalid)
			if !strings.Contains(w.Body.String(), "several") {
				t.Errorf("the problem does not say what is wrong: %s", w.Body)
			}
			if e.calls.Load() != 0 {
				t.Fatal("the handler ran")
			}
			// The same key from one line of each value runs: nothing was claimed.
			for _, v := range lines {
				if w := e.do(req("POST", "/pay", "k1", "{}", "X-Client-ID", v)); w.Code == http.StatusBadRequest {
					t.Fatalf("X-Client-ID %q alone: %d %s", v, w.Code, w.Body)
				}
			}
		})
	}
}

// TestPrincipalNamedLikeTheUnauthenticated: whatever scope ScopeFromPrincipal
// gives requests without a principal, a principal of that very name gets a
// scope of its own: it never sees the keyless clients' records, nor they its.
func TestPrincipalNamedLikeTheUnauthenticated(t *testing.T) {
	for _, unauth := range []string{"anonymous", "guest", "x", "\x00anonymous"} {
		t.Run(unauth, func(t *testing.T) {
			f := ScopeFromPrincipal(unauth)
			none := req("POST", "/pay", "k1", "")
			named := none.WithContext(ContextWithPrincipal(none.Context(), unauth))
			other := none.WithContext(ContextWithPrincipal(none.Context(), "\x00"+unauth))
			if f(none) != unauth {
				t.Fatalf("no principal: scope %q, want %q", f(none), unauth)
			}
			if f(named) == f(none) {
				t.Fatalf("principal %q shares the unauthenticated scope %q", unauth, f(none))
			}
			if f(other) == f(named) || f(other) == f(none) {
				t.Fatalf("principal %q: scope %q collides", "\x00"+unauth, f(other))
			}
		})
	}
}

// TestScopeFromHeaderInvalidName: a header name no request can carry (not an
// RFC 9110 token) would put every client in the fallback's scope, where each
// replays the others' answers; ScopeFromHeader refuses it at construction.
func TestScopeFromHeaderInvalidName(t *testing.T) {
	for _, name := range []string{"", "X Client-ID", "X-Client-ID:", "X-Client\x00", "Clíent"} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatalf("ScopeFromHeader(%q) did not panic", name)
				}
			}()
			ScopeFromHeader(name, "anonymous")
		})
	}
	// A fallback no scope may be (over store.MaxScopeLen bytes) would answer every
	// keyless client 400 for the server's mistake.
	for _, f := range []func(){
		func() { ScopeFromHeader("X-Client-ID", strings.Repeat("a", 1025)) },
		func() { ScopeFromPrincipal(strings.Repeat("a", 1025)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("a fallback scope over store.MaxScopeLen did not panic")
				}
			}()
			f()
		}()
	}
	for _, name := range []string{"X-Client-ID", "x-client-id", "X_Client", "Tenant"} {
		if ScopeFromHeader(name, "anonymous") == nil {
			t.Fatalf("ScopeFromHeader(%q) = nil", name)
		}
	}
}
