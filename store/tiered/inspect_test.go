package tiered_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/tiered"
)

// evictCache is a tiered.Cache that never answers a claim and records the
// evictions it is asked for; err, when set, fails them. (The real pair, Redis in
// front of Postgres, runs the conformance suite's Inspector section in
// store/tiered/integration.)
type evictCache struct {
	evicts []store.EvictPolicy
	err    error
}

func (c *evictCache) Peek(context.Context, store.ID, store.Fingerprint) (store.ClaimResult, bool, error) {
	return store.ClaimResult{}, false, c.err
}
func (c *evictCache) Mark(context.Context, store.ID, store.Fingerprint, store.Token, time.Duration) error {
	return nil
}
func (c *evictCache) Fill(context.Context, store.ID, *store.Record, time.Duration) error { return nil }
func (c *evictCache) Complete(context.Context, store.ID, store.Token, store.Response, time.Duration) error {
	return nil
}
func (c *evictCache) Release(context.Context, store.ID, store.Token) error              { return nil }
func (c *evictCache) Renew(context.Context, store.ID, store.Token, time.Duration) error { return nil }

type inspectingEvictCache struct{ *evictCache }

func (c inspectingEvictCache) Inspect(context.Context, store.ID) (store.Info, error) {
	return store.Info{}, errors.New("the tiered store never inspects its cache")
}

func (c inspectingEvictCache) Evict(_ context.Context, _ store.ID, p store.EvictPolicy) (store.Info, bool, error) {
	c.evicts = append(c.evicts, p)
	return store.Info{}, c.err == nil, c.err
}

// backstopOnly hides the memory store's Inspector.
type backstopOnly struct{ store.Store }

func TestEvictDropsTheCacheCopy(t *testing.T) {
	ctx := t.Context()
	lost := errors.New("redis is down")
	for _, tc := range []struct {
		name      string
		complete  bool // the record is completed (else in flight, lease live)
		absent    bool // the backstop has no record
		cacheErr  error
		evicted   bool
		dropped   bool // the cache was asked to drop its copy
		wantErr   error
		fastError int64
	}{
		{name: "evicted", complete: true, evicted: true, dropped: true},
		{name: "refused", evicted: false, dropped: false},
		{name: "absent in the backstop", absent: true, dropped: true},
		// The claim's peek failed and started a cooldown; the drop is tried anyway.
		{name: "cache down", complete: true, cacheErr: lost, evicted: true, dropped: true, wantErr: lost, fastError: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := inspectingEvictCache{&evictCache{err: tc.cacheErr}}
			s := newTiered(t, cache, memory.New(), tiered.WithCooldown(time.Hour))
			id := store.ID{Scope: "s", Key: "k"}
			if !tc.absent {
				res, err := s.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				if tc.complete {
					if err := s.Complete(ctx, id, res.Token, store.Response{Status: 200}, time.Hour); err != nil {
						t.Fatal(err)
					}
				}
			}
			_, evicted, err := s.Evict(ctx, id, store.EvictSettled)
			if evicted != tc.evicted || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("Evict: evicted %v, %v; want %v, %v", evicted, err, tc.evicted, tc.wantErr)
			}
			if dropped := len(cache.evicts) == 1 && cache.evicts[0] == store.EvictAny; dropped != tc.dropped || len(cache.evicts) > 1 {
				t.Errorf("cache evictions %v, want dropped=%v (once, with EvictAny)", cache.evicts, tc.dropped)
			}
			if got := s.Stats().FastErrors; got != tc.fastError {
				t.Errorf("FastErrors %d, want %d", got, tc.fastError)
			}
		})
	}
}

func TestInspectorUnsupported(t *testing.T) {
	ctx := t.Context()
	id := store.ID{Key: "k"}
	back := memory.New()
	if _, err := back.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// A cache that cannot drop its copy: refused before the backstop evicts.
	s := newTiered(t, &evictCache{}, back)
	if _, _, err := s.Evict(ctx, id, store.EvictAny); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Evict with a cache that is no Inspector: %v, want ErrUnsupported", err)
	}
	if info, err := s.Inspect(ctx, id); err != nil || info.State != store.StateInFlight {
		t.Errorf("Inspect: %v %v; want the untouched in-flight record", info.State, err)
	}
	// A backstop that is no Inspector.
	s = newTiered(t, inspectingEvictCache{&evictCache{}}, backstopOnly{back})
	if _, err := s.Inspect(ctx, id); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Inspect: %v, want ErrUnsupported", err)
	}
	if _, _, err := s.Evict(ctx, id, store.EvictAny); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Evict: %v, want ErrUnsupported", err)
	}
}
