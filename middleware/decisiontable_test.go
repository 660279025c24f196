package middleware_test

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/middleware/internal/decisiontest"
)

// NetHTTPServer is the decision table's router on net/http alone: a ServeMux
// with the middleware around each route and a recover outside it.
func netHTTPServer(t *testing.T, m *middleware.Middleware, a *decisiontest.App) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/pay/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, ok := middleware.KeyFromContext(r.Context())
		body, _ := io.ReadAll(r.Body)
		run, v := a.Pay(r.PathValue("id"), id, ok, body)
		w.Header().Set("X-Run", run)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(v)
	})
	mux.HandleFunc("POST /api/slow", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, a.Slow()) })
	mux.HandleFunc("POST /api/flaky", func(w http.ResponseWriter, r *http.Request) {
		if a.Flaky() {
			http.Error(w, "try later", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "fine")
	})
	mux.HandleFunc("POST /api/panic", func(w http.ResponseWriter, r *http.Request) {
		a.Panic()
		io.WriteString(w, "fine")
	})
	mux.HandleFunc("POST /api/large", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, a.Large()) })
	mux.HandleFunc("POST /api/refuse", func(w http.ResponseWriter, r *http.Request) {
		a.Refuse()
		http.Error(w, "no", http.StatusUnprocessableEntity)
	})
	mux.HandleFunc("GET /api/pay/{id}", func(w http.ResponseWriter, r *http.Request) {
		_, ok := middleware.KeyFromContext(r.Context())
		io.WriteString(w, a.Get(ok))
	})
	h := m.Handler(mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				w.WriteHeader(http.StatusInternalServerError)
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// TestDecisionTableNetHTTP runs the shared decision table (the one every
// adapter runs) against the net/http middleware.
func TestDecisionTableNetHTTP(t *testing.T) { decisiontest.Run(t, netHTTPServer) }
