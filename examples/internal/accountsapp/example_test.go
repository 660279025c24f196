package accountsapp_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/examples/internal/accountsapp"
	"github.com/idemkey/idemkey/examples/internal/setup"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// The account service on embedded defaults (memory store, in-process simulator,
// memory projection): the probes outside the middleware, the API behind the
// client ID and the middleware. A retried deposit is replayed.
func Example() {
	ctx := context.Background()
	env, err := setup.Load(func(string) string { return "" })
	if err != nil {
		panic(err)
	}
	conns, err := setup.Connect(ctx, env) // nothing to connect to on these defaults
	if err != nil {
		panic(err)
	}
	defer conns.Close()
	logger := slog.New(slog.DiscardHandler)
	st := memory.New()
	idem, err := middleware.New(st, middleware.ScopeFromPrincipal(accountsapp.AnonymousScope), middleware.WithLogger(logger))
	if err != nil {
		panic(err)
	}
	app, err := accountsapp.Open(ctx, env, conns, st, prometheus.NewRegistry(), logger)
	if err != nil {
		panic(err)
	}
	defer app.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", app.Readyz)
	mux.Handle("/api/", accountsapp.ClientID(idem.Handler(app.API)))

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
