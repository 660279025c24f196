package idemprom

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// DefaultLatencyBuckets are the store latency histogram's upper bounds, in
// seconds: 100 µs to 2.5 s.
var DefaultLatencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// DefaultWaitBuckets are the wait histogram's upper bounds, in seconds: 1 ms to
// 30 s (a wait is bounded by WithWaitInFlight, 5 s in the examples, and by the
// lease).
var DefaultWaitBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// Observer is the middleware.Observer that counts every request (see the package
// doc for its series). Build it with NewObserver; it is safe for concurrent use.
type Observer struct {
	// Indexed by middleware.Decision, resolved once in NewObserver so Observe
	// does no label lookup.
	decisions [256]prometheus.Counter
	latency   [256]prometheus.Observer

	replays, inFlight, mismatches, storeErrors, takeovers prometheus.Counter
	completionsPending, inTransaction                     prometheus.Counter
	waited                                                prometheus.Observer

	answers  *prometheus.CounterVec
	byStatus [1000]atomic.Pointer[prometheus.Counter] // answers' children, filled on first use
}

var _ middleware.Observer = (*Observer)(nil)

// Option configures an Observer.
type Option func(*options)

type options struct{ buckets, waitBuckets []float64 }

// WithLatencyBuckets sets the store latency histogram's upper bounds, in
// seconds, strictly increasing (default DefaultLatencyBuckets).
func WithLatencyBuckets(b []float64) Option { return func(o *options) { o.buckets = b } }

// WithWaitBuckets sets the wait histogram's upper bounds, in seconds, strictly
// increasing (default DefaultWaitBuckets).
func WithWaitBuckets(b []float64) Option { return func(o *options) { o.waitBuckets = b } }

// NewObserver creates the Observer's collectors and registers them with reg (use
// a registry of the application's own, never the global default). It fails when
// the buckets are empty or not strictly increasing, or reg is nil, and with
// client_golang's error when a series name is already registered.
func NewObserver(reg prometheus.Registerer, opts ...Option) (*Observer, error) {
	if reg == nil {
		return nil, errors.New("idemkey/observer/prometheus: nil Registerer; pass the application's registry")
	}
	o := options{buckets: DefaultLatencyBuckets, waitBuckets: DefaultWaitBuckets}
	for _, opt := range opts {
		opt(&o)
	}
	for _, bs := range []struct {
		name    string
		buckets []float64
	}{{"latency", o.buckets}, {"wait", o.waitBuckets}} {
		if len(bs.buckets) == 0 {
			return nil, fmt.Errorf("idemkey/observer/prometheus: no %s buckets", bs.name)
		}
		for i, b := range bs.buckets {
			if math.IsNaN(b) || i > 0 && b <= bs.buckets[i-1] {
				return nil, fmt.Errorf("idemkey/observer/prometheus: %s buckets %v are not strictly increasing", bs.name, bs.buckets)
			}
		}
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemkey_decisions_total", Help: "Requests seen by the idempotency middleware, by decision.",
	}, []string{"decision"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "idemkey_store_latency_seconds", Help: "Time spent in idempotency store calls on a request's path, by decision.",
		Buckets: o.buckets,
	}, []string{"decision"})
	m := &Observer{
		replays:     counter("idemkey_replays_total", "Stored responses replayed."),
		inFlight:    counter("idemkey_in_flight_total", "409 answers: the key is held by a running request."),
		mismatches:  counter("idemkey_mismatches_total", "422 answers: the key was used for another request."),
		storeErrors: counter("idemkey_store_errors_total", "Idempotency store failures (503, fail-open, failed completion or release)."),
		takeovers:   counter("idemkey_takeovers_total", "Claims that took over an expired lease."),
		completionsPending: counter("idemkey_completions_pending_total",
			"Responses sent before the store held them: the one attempt failed and completion is retried in the background."),
		inTransaction: counter("idemkey_in_transaction_completions_total",
			"Responses the handler stored in its own transaction (MarkCompleted), without the middleware's Complete."),
		answers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemkey_handler_answers_total", Help: "Answers of the protected handler itself (not replays or middleware refusals), by HTTP status.",
		}, []string{"status"}),
	}
	waited := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "idemkey_wait_seconds", Help: "Time a duplicate waited for the request holding its key (WithWaitInFlight), for requests that waited.",
		Buckets: o.waitBuckets,
	})
	m.waited = waited
	all := []prometheus.Collector{decisions, latency, m.replays, m.inFlight, m.mismatches, m.storeErrors, m.takeovers,
		m.completionsPending, m.inTransaction, waited, m.answers}
	for i, c := range all {
		if err := reg.Register(c); err != nil {
			for _, done := range all[:i] { // leave reg as it was
				reg.Unregister(done)
			}
			return nil, err
		}
	}
	for d := range len(m.decisions) {
		name := middleware.Decision(d).String()
		if name == "unknown" {
			continue
		}
		m.decisions[d] = decisions.WithLabelValues(name)
		if touchesStore(middleware.Decision(d)) {
			m.latency[d] = latency.WithLabelValues(name)
		}
	}
	m.decisions[0] = decisions.WithLabelValues("unknown") // never sent; keeps Observe total
	return m, nil
}

// touchesStore reports whether a decision was taken after a store call.
func touchesStore(d middleware.Decision) bool {
	switch d {
	case middleware.Executed, middleware.Released, middleware.LeaseLost, middleware.Replayed,
		middleware.InFlight, middleware.Mismatch, middleware.StoreError, middleware.FailOpen, middleware.StoreFull:
		return true
	}
	return false
}

// Observe implements middleware.Observer.
func (m *Observer) Observe(_ context.Context, e middleware.Event) {
	c := m.decisions[e.Decision]
	if c == nil {
		c = m.decisions[0]
	}
	c.Inc()
	if h := m.latency[e.Decision]; h != nil {
		h.Observe(e.StoreLatency.Seconds())
	}
	switch e.Decision {
	case middleware.Replayed:
		m.replays.Inc()
	case middleware.InFlight:
		m.inFlight.Inc()
	case middleware.Mismatch:
		m.mismatches.Inc()
	}
	// A full store (StoreFull) answered, and a client's hang-up (ClientGone) is no
	// store failure: counted by their decisions only.
	if e.Decision == middleware.StoreError || e.Decision == middleware.FailOpen ||
		e.Err != nil && e.Decision != middleware.StoreFull && e.Decision != middleware.ClientGone && !errors.Is(e.Err, store.ErrLeaseLost) {
		m.storeErrors.Inc()
	}
	if e.Takeover {
		m.takeovers.Inc()
	}
	if e.CompletionPending {
		m.completionsPending.Inc()
	}
	if e.InTransaction {
		m.inTransaction.Inc()
	}
	if e.Waited > 0 {
		m.waited.Observe(e.Waited.Seconds())
	}
	switch e.Decision {
	case middleware.Executed, middleware.Released, middleware.LeaseLost, middleware.FailOpen:
		m.answer(e.Status)
	}
}

// answer counts one handler answer of status (100-999; others are not HTTP
// statuses and are not counted).
func (m *Observer) answer(status int) {
	if status < 100 || status >= len(m.byStatus) {
		return
	}
	p := m.byStatus[status].Load()
	if p == nil {
		c := m.answers.WithLabelValues(strconv.Itoa(status))
		m.byStatus[status].CompareAndSwap(nil, &c)
		p = m.byStatus[status].Load()
	}
	(*p).Inc()
}
