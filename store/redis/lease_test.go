package redis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// TestMarkerWithoutExpiry: a marker's lease is an offset from its key's expiry,
// so a marker whose key lost its expiry (PERSIST, RESTORE without a TTL) has no
// lease to judge. A duplicate must not take it over (a second execution while
// the first runs), Renew must not invent an expiry, and Inspect and Evict must
// not call the lease expired (an operator's sweep would delete a live claim).
// The holder can still complete (with a real creation time) or release it.
func TestMarkerWithoutExpiry(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	s := redis.New(c, redis.WithPrefix(redistest.Prefix(t, c)))
	for _, end := range []string{"complete", "release"} {
		id := store.ID{Scope: "s", Key: end}
		req := claimReq(id, fpA)
		before := time.Now().Add(-time.Second)
		held, err := s.Claim(ctx, req)
		if err != nil || held.Outcome != store.Claimed {
			t.Fatalf("Claim: %+v %v", held, err)
		}
		c.Persist(ctx, s.Key(id))
		for range 3 {
			res, err := s.Claim(ctx, req)
			if !errors.Is(err, store.ErrCorrupt) || res.Outcome == store.Claimed {
				t.Fatalf("duplicate of a marker without expiry: %+v %v, want ErrCorrupt", res, err)
			}
		}
		if err := s.Renew(ctx, id, held.Token, time.Second); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("Renew: %v, want ErrCorrupt", err)
		}
		if ttl := c.PTTL(ctx, s.Key(id)).Val(); ttl != -1 {
			t.Errorf("Renew moved the expiry to %v", ttl)
		}
		if info, err := s.Inspect(ctx, id); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("Inspect: %+v %v, want ErrCorrupt", info, err)
		}
		if _, evicted, err := s.Evict(ctx, id, store.EvictLeaseExpired); evicted || !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("Evict of expired leases: evicted %v %v, want ErrCorrupt", evicted, err)
		}
		if end == "release" {
			if err := s.Release(ctx, id, held.Token); err != nil {
				t.Fatalf("Release: %v", err)
			}
			continue
		}
		if err := s.Complete(ctx, id, held.Token, store.Response{Status: 200}, time.Minute); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		res, err := s.Claim(ctx, req)
		if err != nil || res.Outcome != store.Completed {
			t.Fatalf("Claim after Complete: %+v %v", res, err)
		}
		if res.Record.CreatedAt.Before(before) || res.Record.CreatedAt.After(res.Record.CompletedAt) {
			t.Errorf("CreatedAt %v, CompletedAt %v", res.Record.CreatedAt, res.Record.CompletedAt)
		}
	}
}
