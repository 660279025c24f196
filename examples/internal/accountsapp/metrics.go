package accountsapp

import (
	"context"
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// Metrics is the middleware.Observer that feeds Prometheus. Series (all counters
// start at 0, so dashboards see them before the first event):
//
//	idemkey_decisions_total{decision}          every request, by middleware.Decision name
//	idemkey_store_latency_seconds{decision}    store time on the request's path (claim,
//	                                           then complete or release), for requests
//	                                           that reached the store
//	idemkey_replays_total                      completed records replayed
//	idemkey_in_flight_total                    409 request_in_flight answers
//	idemkey_mismatches_total                   422 key_reused_with_different_payload
//	idemkey_store_errors_total                 store failures: 503 store_unavailable,
//	                                           fail-open runs, failed completions or
//	                                           releases (a lost lease is not one)
//	idemkey_takeovers_total                    claims that took over an expired lease
//	idemkey_handler_answers_total{status}      answers the protected handler itself gave
//	                                           (executed, released, lease lost or fail
//	                                           open), by HTTP status: the account API's
//	                                           409 CONFLICT, 422 VALIDATION_ERROR and
//	                                           INSUFFICIENT_FUNDS, 503 SERVICE_UNAVAILABLE
type Metrics struct {
	decisions    *prometheus.CounterVec
	storeLatency *prometheus.HistogramVec
	replays      prometheus.Counter
	inFlight     prometheus.Counter
	mismatches   prometheus.Counter
	storeErrors  prometheus.Counter
	takeovers    prometheus.Counter
	answers      *prometheus.CounterVec
}

var allDecisions = []middleware.Decision{
	middleware.PassThrough, middleware.NoKey, middleware.KeyMissing, middleware.KeyInvalid,
	middleware.BodyTooLarge, middleware.BodyUnreadable, middleware.Executed, middleware.Released,
	middleware.LeaseLost, middleware.Replayed, middleware.InFlight, middleware.Mismatch,
	middleware.StoreError, middleware.FailOpen,
}

// touchesStore reports whether a decision was taken after a store call.
func touchesStore(d middleware.Decision) bool {
	switch d {
	case middleware.Executed, middleware.Released, middleware.LeaseLost, middleware.Replayed,
		middleware.InFlight, middleware.Mismatch, middleware.StoreError, middleware.FailOpen:
		return true
	}
	return false
}

// NewMetrics creates the collectors and registers them with reg (a registry of the
// application's own, never the global default). It fails if a name is taken.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemkey_decisions_total", Help: "Requests seen by the idempotency middleware, by decision.",
		}, []string{"decision"}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "idemkey_store_latency_seconds", Help: "Time spent in idempotency store calls on a request's path, by decision.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"decision"}),
		replays:     prometheus.NewCounter(prometheus.CounterOpts{Name: "idemkey_replays_total", Help: "Stored responses replayed."}),
		inFlight:    prometheus.NewCounter(prometheus.CounterOpts{Name: "idemkey_in_flight_total", Help: "409 answers: the key is held by a running request."}),
		mismatches:  prometheus.NewCounter(prometheus.CounterOpts{Name: "idemkey_mismatches_total", Help: "422 answers: the key was used for another request."}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "idemkey_store_errors_total", Help: "Idempotency store failures (503, fail-open, failed completion or release)."}),
		takeovers:   prometheus.NewCounter(prometheus.CounterOpts{Name: "idemkey_takeovers_total", Help: "Claims that took over an expired lease."}),
		answers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemkey_handler_answers_total", Help: "Answers of the protected handler itself (not replays or middleware refusals), by HTTP status.",
		}, []string{"status"}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.storeLatency, m.replays, m.inFlight, m.mismatches, m.storeErrors, m.takeovers, m.answers} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, d := range allDecisions {
		m.decisions.WithLabelValues(d.String())
	}
	return m, nil
}

// Observe implements middleware.Observer.
func (m *Metrics) Observe(_ context.Context, e middleware.Event) {
	name := e.Decision.String()
	m.decisions.WithLabelValues(name).Inc()
	if touchesStore(e.Decision) {
		m.storeLatency.WithLabelValues(name).Observe(e.StoreLatency.Seconds())
	}
	switch e.Decision {
	case middleware.Replayed:
		m.replays.Inc()
	case middleware.InFlight:
		m.inFlight.Inc()
	case middleware.Mismatch:
		m.mismatches.Inc()
	}
	if e.Decision == middleware.StoreError || e.Decision == middleware.FailOpen ||
		e.Err != nil && !errors.Is(e.Err, store.ErrLeaseLost) {
		m.storeErrors.Inc()
	}
	if e.Takeover {
		m.takeovers.Inc()
	}
	switch e.Decision {
	case middleware.Executed, middleware.Released, middleware.LeaseLost, middleware.FailOpen:
		if e.Status > 0 {
			m.answers.WithLabelValues(strconv.Itoa(e.Status)).Inc()
		}
	}
}
