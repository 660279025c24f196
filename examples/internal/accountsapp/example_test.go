package accountsapp_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkey/idemkey/examples/internal/accountsapp"
)

// A server's whole wiring on embedded defaults (memory store, in-process
// simulator, memory projection): the probes outside the middleware, the API behind
// it. A retried deposit is replayed.
func Example() {
	getenv := func(string) string { return "" }
	cfg, err := accountsapp.LoadConfig(getenv)
	if err != nil {
		panic(err)
	}
	app, err := accountsapp.Open(context.Background(), cfg, getenv, slog.New(slog.DiscardHandler))
	if err != nil {
		panic(err)
	}
	defer app.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", app.Readyz)
	mux.Handle("/api/", app.ProtectedAPI())

	for range 2 {
		r := httptest.NewRequest("POST", "/api/accounts/6128e305-7e13-5ce6-ba25-6a4b44cc9f0e/deposit",
			strings.NewReader(`{"amountCents":2500}`))
		r.Header.Set("Idempotency-Key", `"order-1"`)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Print(w.Code, " ", w.Header().Get("Idempotent-Replayed"), " ", w.Body)
	}
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	fmt.Print(w.Code, " ", w.Body)
	// Output:
	// 200  {"balanceCents":52500,"aggregateVersion":2}
	// 200 true {"balanceCents":52500,"aggregateVersion":2}
	// 200 {"status":"ready","checks":{"celeriant":"ok","store":"ok"}}
}
