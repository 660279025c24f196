package middleware

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestEscapedSlashIsAnotherRoute: POST /orders/7%2Fcancel reaches the route
// /orders/{id} (id "7/cancel"), POST /orders/7/cancel the route
// /orders/{id}/cancel. With one key, the second must run its own handler or
// be refused as a reused key (422), never get the first's answer replayed.
func TestEscapedSlashIsAnotherRoute(t *testing.T) {
	for _, pair := range [][2]string{
		{"/orders/7%2Fcancel", "/orders/7/cancel"},
		{"/orders/7/cancel", "/orders/7%2Fcancel"},
		{"/orders/7%2fcancel", "/orders/7/cancel"},
		{"/orders/a%2Fb%2Fcancel", "/orders/a/b/cancel"},
	} {
		t.Run(pair[0]+" then "+pair[1], func(t *testing.T) {
			ran := map[string]int{}
			mux := http.NewServeMux()
			for _, p := range []string{"POST /orders/{id}", "POST /orders/{id}/cancel", "POST /orders/{a}/{b}/cancel"} {
				mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
					ran[p]++
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write([]byte(p))
				})
			}
			e := newEnvHandler(t, mux)
			if w := e.do(req("POST", pair[0], "k1", "")); w.Code != http.StatusCreated {
				t.Fatalf("first: %d %s", w.Code, w.Body)
			}
			w := e.do(req("POST", pair[1], "k1", ""))
			if w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("%s got the answer of %s replayed: %q", pair[1], pair[0], w.Body)
			}
			if w.Code != http.StatusUnprocessableEntity {
				t.Fatalf("second: %d %s, want 422 (key reused for another request)", w.Code, w.Body)
			}
		})
	}
}

// TestDefaultRouteSeparatesHandlers: for random request paths made of
// segments, literal and escaped slashes, the default route names two requests
// alike only when a ServeMux hands them to the same pattern with the same
// path values; and a path with nothing escaped is named by its URL path, as
// before (the fingerprints of such records did not change).
func TestDefaultRouteSeparatesHandlers(t *testing.T) {
	route := defaultConfig().route
	mux := http.NewServeMux()
	patterns := []string{"/o/{id}", "/o/{id}/c", "/o/{a}/{b}/c", "/p/{rest...}", "/"}
	for _, p := range patterns {
		mux.HandleFunc(p, func(http.ResponseWriter, *http.Request) {})
	}
	// what the handler sees: its pattern and the wildcards' values.
	seen := func(target string) string {
		r := httptest.NewRequest("POST", target, nil)
		_, pattern := mux.Handler(r)
		if pattern == "" {
			return ""
		}
		// Handler does not set path values; route the request for real.
		var got string
		m := http.NewServeMux()
		m.HandleFunc(pattern, func(_ http.ResponseWriter, r *http.Request) {
			got = pattern + "|" + r.PathValue("id") + "|" + r.PathValue("a") + "|" + r.PathValue("b") + "|" + r.PathValue("rest")
		})
		m.ServeHTTP(httptest.NewRecorder(), r)
		return got
	}
	parts := []string{"/", "%2F", "%2f", "c", "7", "%37", "x", "%41", " "}
	rng := rand.New(rand.NewPCG(22, 1))
	var paths []string
	for range 300 {
		var b strings.Builder
		b.WriteString([]string{"/o/", "/p/"}[rng.IntN(2)])
		for range 1 + rng.IntN(5) {
			b.WriteString(strings.ReplaceAll(parts[rng.IntN(len(parts))], " ", "%20"))
		}
		paths = append(paths, b.String())
	}
	names := map[string]string{} // route name -> first path
	for _, p := range paths {
		r := httptest.NewRequest("POST", p, nil)
		name := route(r)
		if !strings.Contains(p, "%") && name != r.URL.Path {
			t.Errorf("%s: route %q, want the URL path %q", p, name, r.URL.Path)
		}
		if q, ok := names[name]; ok && seen(q) != seen(p) {
			t.Errorf("%s and %s reach %q and %q but share the route %q", q, p, seen(q), seen(p), name)
		}
		names[name] = p
	}
}
