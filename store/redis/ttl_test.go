package redis_test

import (
	"math"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// TestForeverTTL: a retention, lease or fill TTL of "forever" (any duration up
// to math.MaxInt64) still gives the key an expiry, and the marker's lease stays
// judged: a duplicate during the lease is InFlight, never a takeover.
func TestForeverTTL(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
	now := time.Now()
	rec := &store.Record{Fingerprint: fpA, Response: store.Response{Status: 200}, CreatedAt: now, CompletedAt: now, ExpiresAt: now}
	for _, d := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 / 2, 100 * 365 * 24 * time.Hour} {
		for name, write := range map[string]func(store.ID) error{
			"claim": func(id store.ID) error {
				req := store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: time.Minute, Retention: d}
				if res, err := s.Claim(ctx, req); err != nil || res.Outcome != store.Claimed {
					t.Fatalf("Claim: %+v %v", res, err)
				}
				res, err := s.Claim(ctx, req)
				if err != nil || res.Outcome != store.InFlight {
					t.Errorf("retention %v: duplicate during the lease: %+v %v, want InFlight", d, res, err)
				}
				return nil
			},
			"mark": func(id store.ID) error { return s.Mark(ctx, id, fpA, store.NewToken(), d) },
			"fill": func(id store.ID) error { return s.Fill(ctx, id, rec, d) },
		} {
			id := store.ID{Scope: name, Key: d.String()}
			if err := write(id); err != nil {
				t.Fatalf("%s %v: %v", name, d, err)
			}
			if ttl := c.PTTL(ctx, s.Key(id)).Val(); ttl < min(d, 290*365*24*time.Hour)-time.Minute {
				t.Errorf("%s with %v: key TTL %v", name, d, ttl)
			}
		}
	}
}
