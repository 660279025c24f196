package accountsapp

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/middleware"
)

// TestClientID: the header is the principal the middleware scopes by; a value the
// stores cannot hold, or an ambiguous one, is the client's error (400), answered
// before the middleware; no header (or an empty one) is no principal.
func TestClientID(t *testing.T) {
	ran, scope := 0, ""
	h := ClientID(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran++
		scope = middleware.ScopeFromPrincipal(AnonymousScope)(r)
	}))
	for _, tc := range []struct {
		name   string
		values []string
		scope  string // "" = refused
	}{
		{"absent", nil, AnonymousScope},
		{"empty", []string{""}, AnonymousScope},
		{"alice", []string{"alice"}, "alice"},
		{"255 bytes", []string{strings.Repeat("s", MaxClientIDBytes)}, strings.Repeat("s", MaxClientIDBytes)},
		{"256 bytes", []string{strings.Repeat("s", MaxClientIDBytes+1)}, ""},
		{"two lines", []string{"alice", "bob"}, ""},
	} {
		ran, scope = 0, ""
		r := httptest.NewRequest("POST", "/api/transfers", strings.NewReader("{}"))
		for _, v := range tc.values {
			r.Header.Add(ClientIDHeader, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if tc.scope != "" {
			if ran != 1 || w.Code != http.StatusOK || scope != tc.scope {
				t.Errorf("%s: ran %d, status %d, scope %q; want it passed through with scope %q", tc.name, ran, w.Code, scope, tc.scope)
			}
			continue
		}
		if ran != 0 || w.Code != http.StatusBadRequest || w.Header().Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(w.Body.String(), `"code":"malformed_request","error":"MALFORMED_REQUEST"`) ||
			!strings.Contains(w.Body.String(), `"type":"urn:example:accounts:problem:malformed_request"`) {
			t.Errorf("%s: ran %d, %d %s; want a 400 MALFORMED_REQUEST problem", tc.name, ran, w.Code, w.Body)
		}
	}
}
