package idemotel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkey/idemkey/middleware"
	idemotel "github.com/idemkey/idemkey/observer/otel"
	"github.com/idemkey/idemkey/store/memory"
)

// The observer on an SDK with an in-memory exporter: the first request's store
// calls are spans under the request's span, the retry is marked replayed.
func Example() {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	obs, err := idemotel.New(idemotel.WithTracerProvider(tp))
	if err != nil {
		panic(err)
	}
	m, err := middleware.New(memory.New(), middleware.GlobalScope, middleware.WithObserver(obs))
	if err != nil {
		panic(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	tracer := tp.Tracer("server") // in a service: otelhttp.NewHandler starts this span
	for range 2 {
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amountCents":500}`))
		r.Header.Set("Idempotency-Key", `"order-1"`)
		ctx, span := tracer.Start(r.Context(), "POST /payments")
		h.ServeHTTP(httptest.NewRecorder(), r.WithContext(ctx))
		span.End()
	}
	for _, s := range spans.GetSpans() {
		var decision string
		for _, kv := range s.Attributes {
			if kv.Key == idemotel.AttrDecision {
				decision = " decision=" + kv.Value.AsString()
			}
		}
		fmt.Println(s.Name + decision)
	}
	// Output:
	// idemkey.store.claim
	// idemkey.store.complete
	// POST /payments decision=executed
	// idemkey.store.claim
	// POST /payments decision=replayed
}
