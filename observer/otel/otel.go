// Package idemotel reports the idempotency middleware (package middleware) to
// OpenTelemetry, through the OpenTelemetry API only: the application chooses and
// configures the SDK (or none; then everything here is a no-op).
//
//	obs, err := idemotel.New(idemotel.WithTracerProvider(tp), idemotel.WithMeterProvider(mp))
//	...
//	m, err := middleware.New(st, scope, middleware.WithObserver(obs))
//	http.ListenAndServe(addr, otelhttp.NewHandler(m.Handler(mux), "api"))
//
// Traces. Every store call on a request's path (claim, then complete or
// release) is a span of kind client, "idemkey.store.claim",
// "idemkey.store.complete" or "idemkey.store.release", a child of the span in
// the request's context (the one an HTTP server instrumentation such as otelhttp
// starts), with the error recorded and status Error when the store failed. Once
// the response is finished, the request's span gets the attributes
//
//	idemkey.decision               the decision's stable name (middleware.Decision.String)
//	idemkey.replayed               true when a stored response was replayed
//	idemkey.takeover               true when the claim took over an expired lease
//	idemkey.original_completed_at  on a replay: when the original response was
//	                               stored (RFC 3339, the store's clock)
//	idemkey.completion_pending     true when the response was sent before the store
//	                               held it: completion goes on in the background
//	                               (Event.CompletionPending)
//	idemkey.in_transaction         true when the handler stored its response in its
//	                               own transaction (Event.InTransaction)
//	idemkey.wait_seconds           when the request waited for the holder of its key
//	                               (WithWaitInFlight): how long, in seconds (Event.Waited)
//
// A replay links to no span of the original request, which it cannot know; the
// completion time is what ties them. The scope and key are never recorded
// (the scope is usually a principal).
//
// Metrics (docs/architecture.md section 3 for the decisions):
//
//	idemkey.decisions       counter, {request}, attribute idemkey.decision
//	idemkey.store.duration  histogram, seconds, attributes idemkey.store.op
//	                        (claim, complete, release, wait) and error (true when
//	                        the call failed)
package idemotel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/idemkey/idemkey/observer/otel"

// Attribute keys and instrument names, stable.
const (
	AttrDecision            = attribute.Key("idemkey.decision")
	AttrReplayed            = attribute.Key("idemkey.replayed")
	AttrTakeover            = attribute.Key("idemkey.takeover")
	AttrOriginalCompletedAt = attribute.Key("idemkey.original_completed_at")
	AttrInTransaction       = attribute.Key("idemkey.in_transaction")
	AttrCompletionPending   = attribute.Key("idemkey.completion_pending")
	AttrWaited              = attribute.Key("idemkey.wait_seconds")
	AttrStoreOp             = attribute.Key("idemkey.store.op")
	AttrError               = attribute.Key("error")

	MetricDecisions     = "idemkey.decisions"
	MetricStoreDuration = "idemkey.store.duration"
)

// Observer is a middleware.Observer and middleware.StoreObserver reporting to
// OpenTelemetry; build it with New. Safe for concurrent use.
type Observer struct {
	tracer    trace.Tracer
	decisions metric.Int64Counter
	storeDur  metric.Float64Histogram
	// Attribute sets built once: one per decision, one per (op, failed). Room for
	// decisions and ops added later; the last entry is "unknown".
	decisionSets [32]metric.MeasurementOption
	opSets       [8][2]metric.MeasurementOption
	opSpans      [8]string // span name per op
}

var (
	_ middleware.Observer      = (*Observer)(nil)
	_ middleware.StoreObserver = (*Observer)(nil)
)

type config struct {
	tp trace.TracerProvider
	mp metric.MeterProvider
}

// Option configures an Observer.
type Option func(*config)

// WithTracerProvider sets the tracer provider (default otel.GetTracerProvider()).
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// WithMeterProvider sets the meter provider (default otel.GetMeterProvider()).
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

// New returns an Observer with the options applied. It fails on a nil provider
// or when the meter refuses an instrument.
func New(opts ...Option) (*Observer, error) {
	c := config{tp: otel.GetTracerProvider(), mp: otel.GetMeterProvider()}
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil || c.mp == nil {
		return nil, errors.New("idemkey/observer/otel: nil tracer or meter provider")
	}
	meter := c.mp.Meter(ScopeName)
	o := &Observer{tracer: c.tp.Tracer(ScopeName)}
	var err error
	if o.decisions, err = meter.Int64Counter(MetricDecisions, metric.WithUnit("{request}"),
		metric.WithDescription("Requests the idempotency middleware saw, by decision.")); err != nil {
		return nil, err
	}
	if o.storeDur, err = meter.Float64Histogram(MetricStoreDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of the idempotency store calls on a request's path.")); err != nil {
		return nil, err
	}
	for d := range o.decisionSets {
		o.decisionSets[d] = metric.WithAttributeSet(attribute.NewSet(AttrDecision.String(middleware.Decision(d).String())))
	}
	for op := range o.opSets {
		o.opSpans[op] = "idemkey.store." + middleware.StoreOp(op).String()
		for failed := range 2 {
			o.opSets[op][failed] = metric.WithAttributeSet(attribute.NewSet(
				AttrStoreOp.String(middleware.StoreOp(op).String()), AttrError.Bool(failed == 1)))
		}
	}
	return o, nil
}

// Observe counts the decision and sets the attributes of the request's span
// (see the package doc).
func (o *Observer) Observe(ctx context.Context, e middleware.Event) {
	d := min(int(e.Decision), len(o.decisionSets)-1)
	o.decisions.Add(ctx, 1, o.decisionSets[d])
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	replayed := e.Decision == middleware.Replayed
	span.SetAttributes(AttrDecision.String(e.Decision.String()), AttrReplayed.Bool(replayed), AttrTakeover.Bool(e.Takeover))
	if replayed && !e.CompletedAt.IsZero() {
		span.SetAttributes(AttrOriginalCompletedAt.String(e.CompletedAt.UTC().Format(time.RFC3339Nano)))
	}
	if e.CompletionPending {
		span.SetAttributes(AttrCompletionPending.Bool(true))
	}
	if e.InTransaction {
		span.SetAttributes(AttrInTransaction.Bool(true))
	}
	if e.Waited > 0 {
		span.SetAttributes(AttrWaited.Float64(e.Waited.Seconds()))
	}
}

// StoreCallStart starts the store call's span, a child of the span in ctx, and
// returns the function that ends it and records its duration.
func (o *Observer) StoreCallStart(ctx context.Context, op middleware.StoreOp, _ store.ID) (context.Context, func(error)) {
	i := min(int(op), len(o.opSets)-1)
	start := time.Now()
	ctx, span := o.tracer.Start(ctx, o.opSpans[i], trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(AttrStoreOp.String(op.String())))
	return ctx, func(err error) {
		failed := 0
		if err != nil {
			failed = 1
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		o.storeDur.Record(ctx, time.Since(start).Seconds(), o.opSets[i][failed])
	}
}
