package redis_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

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
	s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
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

// endLease ends the lease of the marker under key without waiting for it: its
// lease offset (format.go) becomes the key's PTTL, a lease that ends now.
func endLease(ctx context.Context, c *goredis.Client, key string) error {
	pttl, err := c.PTTL(ctx, key).Result()
	if err == nil && pttl <= 0 {
		err = fmt.Errorf("no marker with a TTL under %q", key)
	}
	if err != nil {
		return err
	}
	var off [8]byte
	binary.BigEndian.PutUint64(off[:], uint64(pttl.Milliseconds()))
	return c.SetRange(ctx, key, 59, string(off[:])).Err()
}

// TestTakeoverFencesTheStaleHolder: 64 concurrent claims of a marker whose lease
// ended (and whose retention did not) give one takeover and 63 InFlight; the
// stale holder's Complete, Release and Renew are then refused, and the record
// stays the new holder's.
func TestTakeoverFencesTheStaleHolder(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	s := redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
	id := store.ID{Scope: "s{x}:\x00", Key: "}{k\x00"}
	req := claimReq(id, fpA)
	stale, err := s.Claim(ctx, req)
	if err != nil || stale.Outcome != store.Claimed {
		t.Fatalf("Claim: %+v %v", stale, err)
	}
	if err := endLease(ctx, c, s.Key(id)); err != nil {
		t.Fatal(err)
	}
	results := make(chan store.ClaimResult, 64)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			res, err := s.Claim(ctx, req)
			if err != nil {
				t.Error(err)
			}
			results <- res
		})
	}
	wg.Wait()
	close(results)
	var winner store.ClaimResult
	for res := range results {
		switch {
		case res.Outcome == store.Claimed && res.Takeover && winner.Token.IsZero():
			winner = res
		case res.Outcome != store.InFlight:
			t.Errorf("claim %+v, want one takeover and InFlight for the rest", res)
		}
	}
	if winner.Token.IsZero() {
		t.Fatal("no takeover")
	}
	for op, err := range map[string]error{
		"Complete": s.Complete(ctx, id, stale.Token, store.Response{Status: 500}, time.Minute),
		"Release":  s.Release(ctx, id, stale.Token),
		"Renew":    s.Renew(ctx, id, stale.Token, time.Minute),
	} {
		if !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("stale %s: %v, want ErrLeaseLost", op, err)
		}
	}
	if err := s.Complete(ctx, id, winner.Token, store.Response{Status: 201}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Claim(ctx, req); err != nil || res.Record == nil || res.Record.Status != 201 {
		t.Errorf("replay %+v %v, want the new holder's 201", res, err)
	}
}
