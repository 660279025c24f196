package tiered_test

import (
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/tiered"
)

// TestEvictDropsAStaleRedisCopy: a completed copy in Redis whose Postgres record
// is gone (evicted behind the tiered store's back) replays until the tiered
// store's Evict, which finds nothing in Postgres and drops the copy: the key is
// new again.
func TestEvictDropsAStaleRedisCopy(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
	back := postgresBackstop(t, pgPool(t))
	s := mustTiered(t, fast, back, tiered.WithTimeout(testTimeout))
	id := store.ID{Scope: "tenant", Key: "order-1"}
	req := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
	res, err := s.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, id, res.Token, store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, evicted, err := back.Evict(ctx, id, store.EvictCompleted); err != nil || !evicted {
		t.Fatalf("backstop Evict: %v %v", evicted, err)
	}
	if res, err := s.Claim(ctx, req); err != nil || res.Outcome != store.Completed {
		t.Fatalf("Claim before the tiered Evict: %v %v; want the stale copy replayed", res.Outcome, err)
	}

	found, evicted, err := s.Evict(ctx, id, store.EvictSettled)
	if err != nil || evicted || found.State != store.StateAbsent {
		t.Fatalf("tiered Evict: %v, evicted %v, %v; want absent, nothing evicted", found.State, evicted, err)
	}
	if n := c.Exists(ctx, fast.Key(id)).Val(); n != 0 {
		t.Fatal("the Redis copy is still there")
	}
	if res, err := s.Claim(ctx, req); err != nil || res.Outcome != store.Claimed || res.Takeover {
		t.Fatalf("Claim after the tiered Evict: %+v %v; want a new claim", res, err)
	}
}
