package idemprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/store/tiered"
)

// Collector is a prometheus.Collector of the stores' own counters, read when
// Prometheus scrapes (see the package doc for its series). Build it with
// NewCollector and register it on the application's registry.
type Collector struct {
	tiered       func() tiered.Stats
	claimRetries func() int64
}

var _ prometheus.Collector = (*Collector)(nil)

// CollectorOption names a store whose counters a Collector exports.
type CollectorOption func(*Collector)

// WithTiered exports the Stats of the tiered store s (store/tiered); a nil s
// exports nothing (every scrape would otherwise fail on it).
func WithTiered(s *tiered.Store) CollectorOption {
	return func(c *Collector) {
		if s != nil {
			c.tiered = s.Stats
		}
	}
}

// WithClaimRetries exports the Postgres store's claim retries; read returns
// them, e.g. func() int64 { return pg.Stats().ClaimRetries } for a
// *postgres.Store pg (module github.com/idemkey/idemkey/store/postgres, which this
// module does not import, so it never brings in pgx).
func WithClaimRetries(read func() int64) CollectorOption {
	return func(c *Collector) { c.claimRetries = read }
}

// NewCollector returns a Collector of the stores opts name; with none it exports
// nothing.
func NewCollector(opts ...CollectorOption) *Collector {
	c := &Collector{}
	for _, o := range opts {
		o(c)
	}
	return c
}

var (
	descFastAnswers  = prometheus.NewDesc("idemkey_tiered_fast_answers_total", "Claims the tiered store's Redis fast path answered alone.", nil, nil)
	descFastMisses   = prometheus.NewDesc("idemkey_tiered_fast_misses_total", "Claims Redis could not decide; the backstop answered.", nil, nil)
	descFallThrough  = prometheus.NewDesc("idemkey_tiered_fall_through_total", "Fast-path calls that fell through to the backstop alone: Redis failed or timed out (error), or was skipped while cooling down after an error (skipped).", []string{"reason"}, nil)
	descBackfills    = prometheus.NewDesc("idemkey_tiered_backfills_total", "Backstop replays copied into Redis.", nil, nil)
	descOutages      = prometheus.NewDesc("idemkey_tiered_outages_total", "Times the tiered store's Redis fast path went down.", nil, nil)
	descDegraded     = prometheus.NewDesc("idemkey_tiered_degraded", "1 while the tiered store's Redis fast path is down (serving from the backstop alone), else 0.", nil, nil)
	descClaimRetries = prometheus.NewDesc("idemkey_postgres_claim_retries_total", "Postgres claim statements re-run because a concurrent claim committed after the statement's snapshot.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	if c.tiered != nil {
		for _, d := range []*prometheus.Desc{descFastAnswers, descFastMisses, descFallThrough, descBackfills, descOutages, descDegraded} {
			ch <- d
		}
	}
	if c.claimRetries != nil {
		ch <- descClaimRetries
	}
}

// Collect implements prometheus.Collector: it reads the stores' counters now.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.tiered != nil {
		s := c.tiered()
		counter := func(d *prometheus.Desc, v int64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
		}
		counter(descFastAnswers, s.FastAnswers)
		counter(descFastMisses, s.FastMisses)
		counter(descFallThrough, s.FastErrors, "error")
		counter(descFallThrough, s.FastSkipped, "skipped")
		counter(descBackfills, s.Backfills)
		counter(descOutages, s.Outages)
		degraded := 0.0
		if s.Degraded {
			degraded = 1
		}
		ch <- prometheus.MustNewConstMetric(descDegraded, prometheus.GaugeValue, degraded)
	}
	if c.claimRetries != nil {
		ch <- prometheus.MustNewConstMetric(descClaimRetries, prometheus.CounterValue, float64(c.claimRetries()))
	}
}
