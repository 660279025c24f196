package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/middleware"
	idemotel "github.com/idemkey/idemkey/observer/otel"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// downStore fails every Claim while down is set.
type downStore struct {
	store.Store
	down atomic.Bool
}

func (s *downStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if s.down.Load() {
		return store.ClaimResult{}, errors.New("connection refused")
	}
	return s.Store.Claim(ctx, req)
}

type harness struct {
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	clock  *testclock.Clock
	mem    *memory.Store
	st     *downStore
	h      http.Handler
}

// newHarness is the middleware with the observer on the SDK's in-memory
// exporters, behind a stand-in for an HTTP server instrumentation that starts
// the request's span "POST /pay".
func newHarness(t *testing.T) *harness {
	t.Helper()
	hs := &harness{spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader(), clock: testclock.New(time.Unix(1_700_000_000, 0))}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(hs.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(hs.reader))
	t.Cleanup(func() { tp.Shutdown(context.Background()); mp.Shutdown(context.Background()) })
	obs, err := idemotel.New(idemotel.WithTracerProvider(tp), idemotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	hs.mem = memory.New(memory.WithClock(hs.clock.Now))
	hs.st = &downStore{Store: hs.mem}
	m, err := middleware.New(hs.st, middleware.GlobalScope, middleware.WithObserver(obs),
		middleware.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	inner := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	tracer := tp.Tracer("server")
	hs.h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracer.Start(r.Context(), r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		inner.ServeHTTP(w, r.WithContext(ctx))
	})
	return hs
}

func (hs *harness) send(path, key string) int {
	r := httptest.NewRequest("POST", path, strings.NewReader("{}"))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	hs.h.ServeHTTP(w, r)
	return w.Code
}

// takeSpans returns the spans ended since the last call, as "name" for store
// calls and "name attr=value..." for the request's span, checking that every
// store span is a client-kind child of the request's span.
func (hs *harness) takeSpans(t *testing.T) (request map[attribute.Key]attribute.Value, store []tracetest.SpanStub) {
	t.Helper()
	stubs := hs.spans.GetSpans()
	hs.spans.Reset()
	var req *tracetest.SpanStub
	for i := range stubs {
		if stubs[i].SpanKind == trace.SpanKindServer {
			req = &stubs[i]
		}
	}
	if req == nil {
		t.Fatalf("no request span among %d", len(stubs))
	}
	request = map[attribute.Key]attribute.Value{}
	for _, kv := range req.Attributes {
		request[kv.Key] = kv.Value
	}
	for _, s := range stubs {
		if s.SpanKind == trace.SpanKindServer {
			continue
		}
		if s.Parent.SpanID() != req.SpanContext.SpanID() || s.SpanContext.TraceID() != req.SpanContext.TraceID() || s.SpanKind != trace.SpanKindClient {
			t.Errorf("store span %s: parent %v kind %v, want a client child of the request span %v", s.Name, s.Parent.SpanID(), s.SpanKind, req.SpanContext.SpanID())
		}
		store = append(store, s)
	}
	return request, store
}

func names(spans []tracetest.SpanStub) string {
	var n []string
	for _, s := range spans {
		n = append(n, s.Name)
	}
	return strings.Join(n, " ")
}

// TestTraces: store calls are child spans of the request's span; the request's
// span carries decision, replay and takeover, and a replay the original's
// completion time; a failed store call is an error span.
func TestTraces(t *testing.T) {
	hs := newHarness(t)

	if c := hs.send("/pay", "a"); c != 201 {
		t.Fatal(c)
	}
	completed := hs.clock.Now()
	req, st := hs.takeSpans(t)
	if names(st) != "idemkey.store.claim idemkey.store.complete" || req["idemkey.decision"].AsString() != "executed" ||
		req["idemkey.replayed"].AsBool() || req["idemkey.takeover"].AsBool() {
		t.Errorf("execution: store spans %q, request attributes %v", names(st), req)
	}
	if _, ok := req["idemkey.original_completed_at"]; ok {
		t.Error("an execution carries original_completed_at")
	}

	hs.clock.Add(time.Minute)
	hs.send("/pay", "a")
	req, st = hs.takeSpans(t)
	if names(st) != "idemkey.store.claim" || req["idemkey.decision"].AsString() != "replayed" || !req["idemkey.replayed"].AsBool() ||
		req["idemkey.original_completed_at"].AsString() != completed.UTC().Format(time.RFC3339Nano) {
		t.Errorf("replay: store spans %q, request attributes %v; want original_completed_at %s", names(st), req, completed.UTC().Format(time.RFC3339Nano))
	}

	hs.send("/fail", "b")
	req, st = hs.takeSpans(t)
	if names(st) != "idemkey.store.claim idemkey.store.release" || req["idemkey.decision"].AsString() != "released" {
		t.Errorf("release: store spans %q, request attributes %v", names(st), req)
	}

	// A holder that died: its lease runs out on the store's clock, the next
	// request takes the key over.
	fp, err := fingerprint.Sum(fingerprint.Request{Method: "POST", Route: "/pay", Body: []byte("{}")}, fingerprint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hs.mem.Claim(context.Background(), store.ClaimRequest{ID: store.ID{Key: "c"}, Fingerprint: fp,
		Lease: time.Second, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	hs.clock.Add(time.Minute)
	hs.send("/pay", "c")
	req, _ = hs.takeSpans(t)
	if !req["idemkey.takeover"].AsBool() {
		t.Errorf("takeover: request attributes %v", req)
	}

	hs.st.down.Store(true)
	if c := hs.send("/pay", "d"); c != 503 {
		t.Fatal(c)
	}
	req, st = hs.takeSpans(t)
	if names(st) != "idemkey.store.claim" || st[0].Status.Code != codes.Error || len(st[0].Events) == 0 || req["idemkey.decision"].AsString() != "store_error" {
		t.Errorf("store error: spans %q status %v events %d, request attributes %v", names(st), st[0].Status, len(st[0].Events), req)
	}
}

// TestSpanAttributesOfRetriesAndWaits: completion retries, an in-transaction
// completion and a wait become attributes of the request's span; an event
// without them sets none of them.
func TestSpanAttributesOfRetriesAndWaits(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	obs, err := idemotel.New(idemotel.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		e    middleware.Event
		want map[attribute.Key]string
	}{
		{middleware.Event{Decision: middleware.Executed, InTransaction: true},
			map[attribute.Key]string{idemotel.AttrInTransaction: "true"}},
		{middleware.Event{Decision: middleware.Executed, CompletionPending: true},
			map[attribute.Key]string{idemotel.AttrCompletionPending: "true"}},
		{middleware.Event{Decision: middleware.Replayed, Waited: 1500 * time.Millisecond},
			map[attribute.Key]string{idemotel.AttrWaited: "1.5"}},
		{middleware.Event{Decision: middleware.Executed}, map[attribute.Key]string{}},
	} {
		ctx, span := tp.Tracer("server").Start(context.Background(), "req")
		obs.Observe(ctx, tc.e)
		span.End()
		got := map[attribute.Key]string{}
		for _, kv := range exp.GetSpans()[0].Attributes {
			switch kv.Key {
			case idemotel.AttrCompletionPending, idemotel.AttrInTransaction, idemotel.AttrWaited:
				got[kv.Key] = kv.Value.Emit()
			}
		}
		exp.Reset()
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%+v: attributes %v, want %v", tc.e, got, tc.want)
		}
	}
}

// TestMetrics: the decision counter and the store latency histogram.
func TestMetrics(t *testing.T) {
	hs := newHarness(t)
	hs.send("/pay", "a")
	hs.send("/pay", "a")
	hs.send("/fail", "b")
	hs.st.down.Store(true)
	hs.send("/pay", "c")

	var rm metricdata.ResourceMetrics
	if err := hs.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	decisions, durations := map[string]int64{}, map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != idemotel.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name != idemotel.MetricDecisions || m.Unit != "{request}" || !data.IsMonotonic {
					t.Errorf("counter %s unit %s", m.Name, m.Unit)
				}
				for _, p := range data.DataPoints {
					v, _ := p.Attributes.Value(idemotel.AttrDecision)
					decisions[v.AsString()] += p.Value
				}
			case metricdata.Histogram[float64]:
				if m.Name != idemotel.MetricStoreDuration || m.Unit != "s" {
					t.Errorf("histogram %s unit %s", m.Name, m.Unit)
				}
				for _, p := range data.DataPoints {
					op, _ := p.Attributes.Value(idemotel.AttrStoreOp)
					failed, _ := p.Attributes.Value(idemotel.AttrError)
					durations[op.AsString()+" error="+failed.Emit()] += p.Count
				}
			}
		}
	}
	wantD := map[string]int64{"executed": 1, "replayed": 1, "released": 1, "store_error": 1}
	wantH := map[string]uint64{"claim error=false": 3, "claim error=true": 1, "complete error=false": 1, "release error=false": 1}
	if len(decisions) != len(wantD) || len(durations) != len(wantH) {
		t.Fatalf("decisions %v, store durations %v; want %v and %v", decisions, durations, wantD, wantH)
	}
	for k, v := range wantD {
		if decisions[k] != v {
			t.Errorf("decisions[%s] = %d, want %d", k, decisions[k], v)
		}
	}
	for k, v := range wantH {
		if durations[k] != v {
			t.Errorf("store durations[%s] = %d, want %d", k, durations[k], v)
		}
	}
}

func TestNewRefusesNilProviders(t *testing.T) {
	if _, err := idemotel.New(idemotel.WithTracerProvider(nil)); err == nil {
		t.Error("nil tracer provider accepted")
	}
	if _, err := idemotel.New(idemotel.WithMeterProvider(nil)); err == nil {
		t.Error("nil meter provider accepted")
	}
}
