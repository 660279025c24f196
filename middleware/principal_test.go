package middleware_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// authenticate is a toy authentication middleware: a known bearer token names
// the principal, an unknown one is a 401, none is unauthenticated.
func authenticate(tokens map[string]string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			user, known := tokens[tok]
			if !known {
				http.Error(w, "unknown token", http.StatusUnauthorized)
				return
			}
			r = r.WithContext(middleware.ContextWithPrincipal(r.Context(), user))
		}
		next.ServeHTTP(w, r)
	})
}

// Keys scoped by the authenticated principal: the authentication middleware
// puts it in the context, ScopeFromPrincipal reads it. Alice and Bob both send
// key "order-1" and each gets their own execution.
func ExampleScopeFromPrincipal() {
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := middleware.KeyFromContext(r.Context())
		fmt.Fprintf(w, "charged for %s, key %s", id.Scope, id.Key)
	})
	m, err := middleware.New(memory.New(), middleware.ScopeFromPrincipal("anonymous"))
	if err != nil {
		panic(err)
	}
	h := authenticate(map[string]string{"t-alice": "user-alice", "t-bob": "user-bob"}, m.Handler(pay))

	for _, token := range []string{"t-alice", "t-bob", "t-alice"} {
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amountCents":500}`))
		r.Header.Set("Authorization", "Bearer "+token)
		r.Header.Set("Idempotency-Key", `"order-1"`)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	// Output:
	// 200  charged for user-alice, key order-1
	// 200  charged for user-bob, key order-1
	// 200 true charged for user-alice, key order-1
}

// TestScopeFromPrincipal: the principal is the scope; without one (or with an
// empty one) the unauthenticated scope applies.
func TestScopeFromPrincipal(t *testing.T) {
	scope := middleware.ScopeFromPrincipal("anonymous")
	for _, tc := range []struct {
		name string
		ctx  func(context.Context) context.Context
		want string
	}{
		{"principal", func(c context.Context) context.Context { return middleware.ContextWithPrincipal(c, "user-1") }, "user-1"},
		{"none", func(c context.Context) context.Context { return c }, "anonymous"},
		{"empty", func(c context.Context) context.Context { return middleware.ContextWithPrincipal(c, "") }, "anonymous"},
		{"innermost wins", func(c context.Context) context.Context {
			return middleware.ContextWithPrincipal(middleware.ContextWithPrincipal(c, "outer"), "inner")
		}, "inner"},
		{"same string, other key", func(c context.Context) context.Context {
			return context.WithValue(c, struct{ name string }{"principal"}, "mallory")
		}, "anonymous"},
	} {
		r := httptest.NewRequest("POST", "/", nil)
		r = r.WithContext(tc.ctx(r.Context()))
		if got := scope(r); got != tc.want {
			t.Errorf("%s: scope %q, want %q", tc.name, got, tc.want)
		}
		p, ok := middleware.PrincipalFromContext(r.Context())
		if want := tc.want != "anonymous"; ok != want || ok && p != tc.want {
			t.Errorf("%s: PrincipalFromContext = %q, %v", tc.name, p, ok)
		}
	}
}
