package tiered_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/storetest"
	"github.com/idemkey/idemkey/store/tiered"
)

var _ tiered.Cache = (*memory.Store)(nil)

// countingStore counts the claims that reach the store it wraps.
type countingStore struct {
	store.Store
	claims int
}

func (c *countingStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	c.claims++
	return c.Store.Claim(ctx, req)
}

// TestConformanceMemoryCache runs the store suite over a memory cache in front
// of a memory backstop, on one fake clock.
func TestConformanceMemoryCache(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		c := testclock.New(time.Unix(1_700_000_000, 0))
		s, err := tiered.New(memory.New(memory.WithClock(c.Now)), memory.New(memory.WithClock(c.Now)))
		if err != nil {
			t.Fatal(err)
		}
		return storetest.Subject{Store: s, Wait: c.Add}
	})
}

// TestMemoryCacheAnswersReplays: once a record completed through the tiered
// store, or was replayed by the backstop once (and copied into the cache),
// its replays are answered by the cache alone, without allocating; a record the
// cache cannot hold, the store being full, is answered by the backstop.
func TestMemoryCacheAnswersReplays(t *testing.T) {
	ctx := t.Context()
	back := &countingStore{Store: memory.New()}
	cache := memory.New(memory.WithMaxBytes(2 * (memory.RecordOverhead + 64)))
	s, err := tiered.New(cache, back)
	if err != nil {
		t.Fatal(err)
	}
	req := func(key string) store.ClaimRequest {
		return store.ClaimRequest{ID: store.ID{Scope: "t", Key: key}, Lease: time.Second, Retention: time.Hour}
	}
	run := func(key string) {
		res, err := s.Claim(ctx, req(key))
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("claim %s: %v %v", key, res.Outcome, err)
		}
		if err := s.Complete(ctx, req(key).ID, res.Token, store.Response{Status: 201, Body: []byte("ok")}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	run("a")
	back.claims = 0
	replay := func() {
		if res, err := s.Claim(ctx, req("a")); err != nil || res.Outcome != store.Completed || string(res.Record.Body) != "ok" {
			t.Fatalf("replay: %+v %v", res, err)
		}
	}
	replay()
	if n := testing.AllocsPerRun(100, replay); n != 0 {
		t.Errorf("a replay from the memory cache allocates %v times, want 0", n)
	}
	if back.claims != 0 {
		t.Fatalf("%d replays reached the backstop, want 0", back.claims)
	}

	// The cache now holds a's record, past its bound: b's marker is not kept, so
	// its replays go to the backstop, and copies into the cache are refused too.
	run("b")
	back.claims = 0
	for range 3 {
		if res, err := s.Claim(ctx, req("b")); err != nil || res.Outcome != store.Completed {
			t.Fatalf("replay of b: %+v %v", res, err)
		}
	}
	if back.claims != 3 || cache.Stats().Refused < 3 {
		t.Fatalf("replays of a record the full cache could not hold: %d backstop claims, cache %+v; want 3 and refusals",
			back.claims, cache.Stats())
	}
	if st := s.Stats(); st.FastErrors != 0 || st.Degraded {
		t.Fatalf("a full cache counted as a failing one: %+v", st)
	}
}

// TestMemoryCacheMarker: a claim in flight answers its duplicates from the
// cache's marker (409 without the backstop), a duplicate with another payload
// goes to the backstop (which says Mismatch), and the marker ends with the
// claim's Release or its lease.
func TestMemoryCacheMarker(t *testing.T) {
	ctx := t.Context()
	c := testclock.New(time.Unix(1_700_000_000, 0))
	back := &countingStore{Store: memory.New(memory.WithClock(c.Now))}
	s, err := tiered.New(memory.New(memory.WithClock(c.Now)), back)
	if err != nil {
		t.Fatal(err)
	}
	r := store.ClaimRequest{ID: store.ID{Key: "k"}, Lease: time.Second, Retention: time.Hour}
	first, err := s.Claim(ctx, r)
	if err != nil || first.Outcome != store.Claimed {
		t.Fatalf("claim: %v %v", first.Outcome, err)
	}
	back.claims = 0
	if res, err := s.Claim(ctx, r); err != nil || res.Outcome != store.InFlight || back.claims != 0 {
		t.Fatalf("duplicate in flight: %v %v, %d backstop claims", res.Outcome, err, back.claims)
	}
	other := r
	other.Fingerprint[0] = 1
	if res, err := s.Claim(ctx, other); err != nil || res.Outcome != store.Mismatch || back.claims != 1 {
		t.Fatalf("other payload in flight: %v %v, %d backstop claims", res.Outcome, err, back.claims)
	}
	if err := s.Release(ctx, r.ID, first.Token); err != nil {
		t.Fatal(err)
	}
	second, err := s.Claim(ctx, r)
	if err != nil || second.Outcome != store.Claimed {
		t.Fatalf("claim after release: %v %v", second.Outcome, err)
	}
	c.Add(2 * time.Second) // the lease ends in both stores
	if res, err := s.Claim(ctx, r); err != nil || res.Outcome != store.Claimed || !res.Takeover {
		t.Fatalf("claim after the lease: %+v %v", res, err)
	}
}
