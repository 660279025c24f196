package idemprom_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	idemprom "github.com/idemkey/idemkey/observer/prometheus"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/tiered"
)

// downCache is a tiered.Cache that holds nothing and, while down is set, fails
// like a stopped Redis.
type downCache struct{ down atomic.Bool }

func (c *downCache) err() error {
	if c.down.Load() {
		return errors.New("connection refused")
	}
	return nil
}
func (c *downCache) Peek(context.Context, store.ID, store.Fingerprint) (store.ClaimResult, bool, error) {
	return store.ClaimResult{}, false, c.err()
}
func (c *downCache) Mark(context.Context, store.ID, store.Fingerprint, store.Token, time.Duration) error {
	return c.err()
}
func (c *downCache) Fill(context.Context, store.ID, *store.Record, time.Duration) error {
	return c.err()
}
func (c *downCache) Complete(context.Context, store.ID, store.Token, store.Response, time.Duration) error {
	return c.err()
}
func (c *downCache) Release(context.Context, store.ID, store.Token) error { return c.err() }
func (c *downCache) Ping(context.Context) error                           { return c.err() }
func (c *downCache) Renew(context.Context, store.ID, store.Token, time.Duration) error {
	return c.err()
}

// TestCollector: the tiered store's counters and state and the claim retries
// are read at every scrape, so a Redis outage shows as the fall-through counter
// rising and the degraded gauge at 1, and its end as the gauge back at 0.
func TestCollector(t *testing.T) {
	cache := &downCache{}
	ts, err := tiered.New(cache, memory.New(), tiered.WithCooldown(time.Hour),
		tiered.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	var retries atomic.Int64
	reg := prometheus.NewRegistry()
	if err := reg.Register(idemprom.NewCollector(idemprom.WithTiered(ts), idemprom.WithClaimRetries(retries.Load))); err != nil {
		t.Fatal(err)
	}
	claim := func(key string) {
		t.Helper()
		if _, err := ts.Claim(context.Background(), store.ClaimRequest{
			ID: store.ID{Key: key}, Lease: time.Minute, Retention: time.Hour,
		}); err != nil {
			t.Fatal(err)
		}
	}
	claim("a")
	got := gather(t, reg)
	for name, want := range map[string]float64{
		"idemkey_tiered_fast_misses_total":        1,
		"idemkey_tiered_fast_answers_total":       0,
		"idemkey_tiered_fall_through_total/error": 0,
		"idemkey_tiered_degraded":                 0,
		"idemkey_tiered_outages_total":            0,
		"idemkey_tiered_backfills_total":          0,
		"idemkey_postgres_claim_retries_total":    0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("before the outage: %s = %v (present %v), want %v", name, v, ok, want)
		}
	}

	cache.down.Store(true)
	claim("b") // the peek fails: one error, then the marker write is skipped
	claim("c") // cooling down: peek and marker write skipped
	retries.Store(3)
	got = gather(t, reg)
	for name, want := range map[string]float64{
		"idemkey_tiered_fall_through_total/error":   1,
		"idemkey_tiered_fall_through_total/skipped": 3,
		"idemkey_tiered_degraded":                   1,
		"idemkey_tiered_outages_total":              1,
		"idemkey_postgres_claim_retries_total":      3,
	} {
		if got[name] != want {
			t.Errorf("during the outage: %s = %v, want %v", name, got[name], want)
		}
	}

	cache.down.Store(false)
	if err := ts.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := gather(t, reg); got["idemkey_tiered_degraded"] != 0 || got["idemkey_tiered_outages_total"] != 1 {
		t.Errorf("after the outage: degraded %v, outages %v; want 0 and 1", got["idemkey_tiered_degraded"], got["idemkey_tiered_outages_total"])
	}
}

// TestCollectorEmpty: without stores the collector exports nothing, and it
// registers (an unchecked collector) without error. A nil *tiered.Store (the
// variable of a server that did not build one) is no store, not a panic at the
// first scrape.
func TestCollectorEmpty(t *testing.T) {
	var none *tiered.Store
	for name, opt := range map[string]idemprom.CollectorOption{"nil": idemprom.WithTiered(nil), "nil *tiered.Store": idemprom.WithTiered(none)} {
		reg := prometheus.NewRegistry()
		if err := reg.Register(idemprom.NewCollector(opt)); err != nil {
			t.Fatal(err)
		}
		if got := gather(t, reg); len(got) != 0 {
			t.Errorf("%s: exported %v", name, got)
		}
	}
}
