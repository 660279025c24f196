package accountsapp

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestScopeGuard: a scope the stores cannot hold, or an ambiguous one, is the
// client's error (400), answered before the middleware; anything else passes.
func TestScopeGuard(t *testing.T) {
	ran := 0
	h := ScopeGuard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran++ }))
	for _, tc := range []struct {
		name   string
		values []string
		pass   bool
	}{
		{"absent", nil, true},
		{"255 bytes", []string{strings.Repeat("s", MaxScopeBytes)}, true},
		{"256 bytes", []string{strings.Repeat("s", MaxScopeBytes+1)}, false},
		{"two lines", []string{"alice", "bob"}, false},
	} {
		ran = 0
		r := httptest.NewRequest("POST", "/api/transfers", strings.NewReader("{}"))
		for _, v := range tc.values {
			r.Header.Add(ScopeHeader, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if tc.pass {
			if ran != 1 || w.Code != http.StatusOK {
				t.Errorf("%s: ran %d, status %d; want it passed through", tc.name, ran, w.Code)
			}
			continue
		}
		if ran != 0 || w.Code != http.StatusBadRequest || w.Header().Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(w.Body.String(), `"code":"MALFORMED_REQUEST"`) {
			t.Errorf("%s: ran %d, %d %s; want a 400 MALFORMED_REQUEST problem", tc.name, ran, w.Code, w.Body)
		}
	}
}
