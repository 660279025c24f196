package chitest_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/middleware/internal/decisiontest"
)

// newServer is the decision table's router on chi with the plain net/http
// middleware in a group (so it runs after routing) and chi's Recoverer outside.
func newServer(t *testing.T, m *middleware.Middleware, a *decisiontest.App) http.Handler {
	r := chi.NewRouter()
	r.Use(chimw.Recoverer)
	r.Route("/api", func(r chi.Router) {
		r.Group(func(r chi.Router) {
			r.Use(m.Handler)
			r.Post("/pay/{id}", func(w http.ResponseWriter, r *http.Request) {
				id, ok := middleware.KeyFromContext(r.Context())
				body, _ := io.ReadAll(r.Body)
				run, v := a.Pay(chi.URLParam(r, "id"), id, ok, body)
				w.Header().Set("X-Run", run)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				json.NewEncoder(w).Encode(v)
			})
			r.Post("/slow", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, a.Slow()) })
			r.Post("/flaky", func(w http.ResponseWriter, r *http.Request) {
				if a.Flaky() {
					http.Error(w, "try later", http.StatusServiceUnavailable)
					return
				}
				io.WriteString(w, "fine")
			})
			r.Post("/panic", func(w http.ResponseWriter, r *http.Request) {
				a.Panic()
				io.WriteString(w, "fine")
			})
			r.Post("/large", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, a.Large()) })
			r.Post("/refuse", func(w http.ResponseWriter, r *http.Request) {
				a.Refuse()
				http.Error(w, "no", http.StatusUnprocessableEntity)
			})
			r.Get("/pay/{id}", func(w http.ResponseWriter, r *http.Request) {
				_, ok := middleware.KeyFromContext(r.Context())
				io.WriteString(w, a.Get(ok))
			})
		})
	})
	return r
}

// chiPattern names the route by chi's pattern, e.g. "/api/pay/{id}".
func chiPattern(r *http.Request) string { return chi.RouteContext(r.Context()).RoutePattern() }

// TestDecisionTable runs the shared decision table (the one the net/http
// middleware and every adapter run) on chi without an adapter, with the URL
// path and with chi's pattern as the fingerprint's route.
func TestDecisionTable(t *testing.T) {
	t.Run("route=path", func(t *testing.T) { decisiontest.Run(t, newServer) })
	t.Run("route=chi pattern", func(t *testing.T) {
		decisiontest.Run(t, newServer, middleware.WithRequestFingerprint(middleware.FingerprintRule{Route: chiPattern, MaxBody: decisiontest.MaxRequestBody}))
	})
}

// TestRoutePattern: inside a chi group the middleware sees the matched pattern,
// so the fingerprint's route is the pattern: one key on two resources of one
// route is then one request (replayed), where the default URL path refuses it
// (422).
func TestRoutePattern(t *testing.T) {
	var seen []string
	record := func(r *http.Request) string {
		p := chiPattern(r)
		seen = append(seen, p)
		return p
	}
	for _, tc := range []struct {
		name   string
		route  middleware.Option
		second int
		seen   string
	}{
		{"chi pattern", middleware.WithRequestFingerprint(middleware.FingerprintRule{Route: record}), 201, "/api/pay/{id} /api/pay/{id}"},
		{"url path (default)", middleware.WithRequestFingerprint(middleware.FingerprintRule{Route: func(r *http.Request) string { return r.URL.Path }}), 422, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen = nil
			m, a := decisiontest.New(t, tc.route)
			h := newServer(t, m, a)
			codes := []int{}
			for _, path := range []string{"/api/pay/1", "/api/pay/2"} {
				r := httptest.NewRequest("POST", path, strings.NewReader(`{"n":1}`))
				r.Header.Set("Idempotency-Key", "one")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				codes = append(codes, w.Code)
			}
			if codes[0] != 201 || codes[1] != tc.second || strings.Join(seen, " ") != tc.seen || a.Runs("pay") != 1 {
				t.Errorf("codes %v (want 201, %d), routes seen %q (want %q), runs %d", codes, tc.second, seen, tc.seen, a.Runs("pay"))
			}
		})
	}
}
