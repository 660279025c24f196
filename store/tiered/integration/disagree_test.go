package tiered_test

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/tiered"
)

// TestCacheFollowsBackstopLease: the cache's marker (Mark: lease offset
// 0, the key expires with the lease) follows the backstop's lease through
// Renew, longer and shorter, as Peek judges it from the key's PTTL, and
// becomes the record on Complete.
func TestCacheFollowsBackstopLease(t *testing.T) {
	d := newDisagreement(t, "lease")
	c, fast, s, req, held := d.c, d.fast, d.s, d.req, d.held
	ctx, id := t.Context(), req.ID
	left := func() time.Duration {
		t.Helper()
		r, ok, err := fast.Peek(ctx, id, req.Fingerprint)
		if err != nil || !ok || r.Outcome != store.InFlight {
			t.Fatalf("cache Peek %+v %v %v", r, ok, err)
		}
		return r.RetryAfter
	}
	if l := left(); l > time.Minute || l < 50*time.Second {
		t.Errorf("after the claim: %v", l)
	}
	if err := s.Renew(ctx, id, held.Token, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if l := left(); l <= time.Minute {
		t.Errorf("after Renew(10m): %v", l)
	}
	if err := s.Renew(ctx, id, held.Token, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if l := left(); l > 2*time.Second {
		t.Errorf("after Renew(2s): %v", l)
	}
	if err := s.Complete(ctx, id, held.Token, store.Response{Status: 201, Body: []byte("ok")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	r, ok, err := fast.Peek(ctx, id, req.Fingerprint)
	if err != nil || !ok || r.Outcome != store.Completed || string(r.Record.Body) != "ok" {
		t.Fatalf("cache after Complete: %+v %v %v", r, ok, err)
	}
	if p := c.PTTL(ctx, fast.Key(id)).Val(); p > time.Hour || p < 50*time.Minute {
		t.Errorf("cache record TTL %v, want about the retention", p)
	}
	other := req
	other.Fingerprint = fingerprint("b")
	if r, err := s.Claim(ctx, other); err != nil || r.Outcome != store.Mismatch {
		t.Errorf("other payload: %+v %v", r, err)
	}
}

// TestStaleCacheMarker: a release the cache missed leaves its marker
// answering InFlight only until the marker's lease ends; then the backstop
// decides, the new claim's marker replaces the stale one, and the stale
// holder's late calls are refused by the backstop without touching the cache.
func TestStaleCacheMarker(t *testing.T) {
	d := newDisagreement(t, "stale")
	c, back, fast, s, req, stale := d.c, d.back, d.fast, d.s, d.req, d.held
	ctx, id := t.Context(), req.ID
	if err := back.Release(ctx, id, stale.Token); err != nil { // the cache's Release was lost
		t.Fatal(err)
	}
	if r, err := s.Claim(ctx, req); err != nil || r.Outcome != store.InFlight {
		t.Fatalf("while the stale marker's lease lasts: %+v %v", r, err)
	}
	key := fast.Key(id)
	var off [8]byte // the marker's lease ends now (lease offset = PTTL)
	binary.BigEndian.PutUint64(off[:], uint64(c.PTTL(ctx, key).Val().Milliseconds()))
	c.SetRange(ctx, key, 59, string(off[:]))
	fresh, err := s.Claim(ctx, req)
	if err != nil || fresh.Outcome != store.Claimed {
		t.Fatalf("after the stale lease: %+v %v", fresh, err)
	}
	for op, err := range map[string]error{
		"Complete": s.Complete(ctx, id, stale.Token, store.Response{Status: 200}, time.Hour),
		"Renew":    s.Renew(ctx, id, stale.Token, time.Hour),
		"Release":  s.Release(ctx, id, stale.Token),
	} {
		if !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("stale %s: %v", op, err)
		}
	}
	if r, err := s.Claim(ctx, req); err != nil || r.Outcome != store.InFlight {
		t.Errorf("the new holder in flight: %+v %v", r, err)
	}
	if err := s.Complete(ctx, id, fresh.Token, store.Response{Status: 201, Body: []byte("fresh")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]store.Store{"tiered": s, "backstop": back} {
		if r, err := st.Claim(ctx, req); err != nil || r.Outcome != store.Completed || string(r.Record.Body) != "fresh" {
			t.Errorf("%s replay %+v %v", name, r, err)
		}
	}
}

// disagreement is a tiered store (Redis in front of a backstop) with one key
// claimed through it: the setup of the cases where the two may disagree.
type disagreement struct {
	c    *goredis.Client
	back store.Store
	fast *redis.Store
	s    *tiered.Store
	req  store.ClaimRequest
	held store.ClaimResult
}

func newDisagreement(t *testing.T, key string) disagreement {
	t.Helper()
	d := disagreement{c: redistest.Shared(t), back: anyBackstop(t)}
	d.fast = mustRedis(t, d.c, redis.WithPrefix(redistest.Prefix(t, d.c)))
	d.s = mustTiered(t, d.fast, d.back, tiered.WithTimeout(testTimeout))
	d.req = store.ClaimRequest{ID: store.ID{Scope: "t", Key: key}, Fingerprint: fingerprint("a"),
		Lease: time.Minute, Retention: time.Hour}
	var err error
	d.held, err = d.s.Claim(t.Context(), d.req)
	if err != nil || d.held.Outcome != store.Claimed {
		t.Fatalf("Claim %+v %v", d.held, err)
	}
	return d
}
