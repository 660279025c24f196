package tiered_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/tiered"
)

// afterClaim runs a hook between the backstop's answer and the tiered store's use of
// it, to interleave another request deterministically.
type afterClaim struct {
	store.Store
	hook func(store.ClaimResult)
}

func (a *afterClaim) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	res, err := a.Store.Claim(ctx, req)
	if err == nil && a.hook != nil {
		a.hook(res)
	}
	return res, err
}

// TestBackfillKeepsNewerMarker: a backstop replay is copied to Redis some time after
// the backstop read it. When the record's retention ended meanwhile and a new claim
// (another payload) wrote its marker, the late backfill must not replace that
// marker: the new claim's retries would get Mismatch from Redis instead of InFlight.
func TestBackfillKeepsNewerMarker(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	back := &afterClaim{Store: memory.New()}
	fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
	s := mustTiered(t, fast, back, tiered.WithTimeout(testTimeout))
	id := store.ID{Scope: "tenant", Key: "k"}
	reqA := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
	reqB := store.ClaimRequest{ID: id, Fingerprint: fingerprint("b"), Lease: time.Minute, Retention: time.Hour}

	res, err := s.Claim(ctx, reqA)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if err := s.Complete(ctx, id, res.Token, store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	c.Del(ctx, fast.Key(id)) // Redis lost the record: the next replay goes to the backstop

	newer := store.NewToken()
	back.hook = func(r store.ClaimResult) {
		back.hook = nil
		if r.Outcome != store.Completed {
			t.Errorf("backstop answered %v, want completed", r.Outcome)
		}
		// Meanwhile (in the real race: the record's retention ended and another
		// payload claimed the key) a newer claim's marker reaches Redis.
		if err := fast.Mark(ctx, id, reqB.Fingerprint, newer, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := s.Claim(ctx, reqA); err != nil || r.Outcome != store.Completed {
		t.Fatalf("replay: %+v %v", r, err)
	}
	got, ok, err := fast.Peek(ctx, id, reqB.Fingerprint)
	if err != nil || !ok || got.Outcome != store.InFlight {
		t.Fatalf("Redis answers %+v ok=%v err=%v for the newer claim's retry; want in flight (its marker kept)", got, ok, err)
	}
}
