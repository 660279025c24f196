package middleware

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/store"
)

// headerValue reports whether v is a value net/http delivers as a header line:
// no control bytes but tab, no leading or trailing space or tab (the server
// trims them).
func headerValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return strings.TrimSpace(v) == v
}

// FuzzScopeFromHeader: two requests share a scope the middleware accepts only
// when they name the same client: both send the same value, or both send none
// (absent or empty) and get the fallback. No value reaches the fallback's scope,
// and a header on several lines is always refused.
func FuzzScopeFromHeader(f *testing.F) {
	for _, s := range [][3]string{{"anonymous", "", "anonymous"}, {"a", "b", "anonymous"}, {"", "", ""}, {"x", "\x00x", "x"}, {"a,b", "a", ""}} {
		f.Add(s[0], s[1], s[2], false)
	}
	f.Fuzz(func(t *testing.T, a, b, fallback string, several bool) {
		if !headerValue(a) || !headerValue(b) || len(fallback) > store.MaxScopeLen {
			t.Skip("input out of the fuzzed class: a value no header can carry, or a fallback over store.MaxScopeLen")
		}
		scope := ScopeFromHeader("x-client-id", fallback)
		at := func(lines ...string) string {
			r := httptest.NewRequest("POST", "/", nil)
			for _, v := range lines {
				r.Header.Add("X-Client-Id", v)
			}
			return scope(r)
		}
		if several {
			if s := at(a, b); len(s) <= store.MaxScopeLen {
				t.Fatalf("lines %q, %q: scope %q accepted", a, b, s)
			}
			return
		}
		sa, sb := at(a), at(b)
		if sa == sb && a != b && !(a == "" && b == "") {
			t.Fatalf("values %q and %q share the scope %q", a, b, sa)
		}
		if a != "" && sa == fallback {
			t.Fatalf("value %q reaches the fallback's scope %q", a, fallback)
		}
		if a == "" && sa != fallback || at() != fallback {
			t.Fatalf("no value: scope %q, want %q", sa, fallback)
		}
	})
}

// FuzzScopeFromPrincipal: two requests share a scope only when they carry the
// same principal, or none; no principal reaches the unauthenticated scope.
func FuzzScopeFromPrincipal(f *testing.F) {
	for _, s := range [][3]string{{"anonymous", "", "anonymous"}, {"\x00anonymous", "anonymous", "anonymous"}, {"a", "\x00a", "b"}, {"", "x", ""}} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, p, q, unauth string) {
		scope := ScopeFromPrincipal(unauth)
		of := func(p string) string {
			r := httptest.NewRequest("POST", "/", nil)
			return scope(r.WithContext(ContextWithPrincipal(context.Background(), p)))
		}
		sp, sq := of(p), of(q)
		if sp == sq && p != q {
			t.Fatalf("principals %q and %q share the scope %q", p, q, sp)
		}
		if p != "" && sp == unauth {
			t.Fatalf("principal %q reaches the unauthenticated scope %q", p, unauth)
		}
		if p == "" && sp != unauth {
			t.Fatalf("no principal: scope %q, want %q", sp, unauth)
		}
	})
}
