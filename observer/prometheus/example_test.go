package idemprom_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/middleware"
	idemprom "github.com/idemkey/idemkey/observer/prometheus"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/tiered"
)

// The Observer on the middleware, the Collector on the store, both on the
// application's own registry (serve it with promhttp.HandlerFor). A retried
// request counts one execution and one replay. The tiered store here has an
// empty in-process cache (downCache, up) in front of its memory backstop: both
// claims miss it, and the backstop's replay is copied into it.
func Example() {
	reg := prometheus.NewRegistry()
	obs, err := idemprom.NewObserver(reg)
	if err != nil {
		panic(err)
	}
	st, err := tiered.New(&downCache{}, memory.New())
	if err != nil {
		panic(err)
	}
	if err := reg.Register(idemprom.NewCollector(idemprom.WithTiered(st))); err != nil {
		panic(err)
	}
	m, err := middleware.New(st, middleware.GlobalScope,
		middleware.WithObserver(obs), middleware.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	for range 2 {
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amountCents":100}`))
		r.Header.Set("Idempotency-Key", `"order-1"`)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	show(reg, "idemkey_")
	fmt.Println("degraded:", st.Stats().Degraded)
	// Output:
	// idemkey_decisions_total{decision="executed"} 1
	// idemkey_decisions_total{decision="replayed"} 1
	// idemkey_handler_answers_total{status="201"} 1
	// idemkey_replays_total 1
	// idemkey_store_latency_seconds{decision="executed"} count 1
	// idemkey_store_latency_seconds{decision="replayed"} count 1
	// idemkey_tiered_backfills_total 1
	// idemkey_tiered_fast_misses_total 2
	// degraded: false
}
