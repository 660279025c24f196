package memory

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// checkHeap verifies that every record is in its shard's expiry heap exactly
// once, at the index it knows, and that the heap is ordered.
func checkHeap(t *testing.T, s *Store) {
	t.Helper()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n := 0
		for h, e := range sh.records {
			for ; e != nil; e = e.next {
				if e.hash != h {
					t.Fatalf("shard %d: record of %v chained under hash %x, its hash is %x", i, e.id, h, e.hash)
				}
				n++
			}
		}
		if len(sh.expiry) != n {
			t.Fatalf("shard %d: %d heap items for %d records", i, len(sh.expiry), n)
		}
		for j, it := range sh.expiry {
			e := it.e
			if int(e.index) != j || sh.records[e.hash].find(e.id) != e || it.at != e.expiresAt {
				t.Fatalf("shard %d: heap item %d (index %d) is not the record of %v", i, j, e.index, e.id)
			}
			if p := (j - 1) / 2; j > 0 && sh.expiry[p].at > it.at {
				t.Fatalf("shard %d: heap order broken at %d", i, j)
			}
		}
		sh.mu.Unlock()
	}
}

// Random claims, takeovers, completions, releases, renewals and expiries keep
// the heap exact: memory is bounded by the records, not by the calls made.
// With a hash mask, IDs share hashes: 1 leaves two chains, 0 one chain of all.
func TestExpiryHeapStaysExact(t *testing.T) {
	for _, mask := range []uint64{^uint64(0), 1, 0} {
		t.Run(strconv.FormatUint(mask, 16), func(t *testing.T) { testExpiryHeapStaysExact(t, mask) })
	}
}

func testExpiryHeapStaysExact(t *testing.T, mask uint64) {
	now := time.Unix(1_700_000_000, 0)
	s := New(WithClock(func() time.Time { return now }), WithShards(2))
	s.hashMask = mask
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := map[store.ID]store.Token{}
	for i := range 20000 {
		id := store.ID{Key: strconv.Itoa(rng.IntN(50))}
		switch op := rng.IntN(10); {
		case op < 4:
			res, err := s.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Duration(1+rng.IntN(5)) * time.Second,
				Retention: time.Duration(5+rng.IntN(20)) * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if res.Outcome == store.Claimed {
				tokens[id] = res.Token
			}
		case op < 6:
			s.Complete(ctx, id, tokens[id], store.Response{Status: 200}, time.Duration(1+rng.IntN(30))*time.Second)
		case op < 7:
			s.Release(ctx, id, tokens[id])
		case op < 8:
			s.Renew(ctx, id, tokens[id], time.Duration(1+rng.IntN(40))*time.Second)
		default:
			now = now.Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
		}
		if i%97 == 0 {
			checkHeap(t, s)
		}
	}
	checkHeap(t, s)
	// Released keys leave nothing behind.
	for range 1000 {
		id := store.ID{Key: "cycle"}
		res, _ := s.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Second, Retention: time.Hour})
		if err := s.Release(ctx, id, res.Token); err != nil {
			t.Fatal(err)
		}
	}
	checkHeap(t, s)
}

// A holder that keeps renewing is never swept, even past the claim's retention:
// otherwise a second execution could start while the first still runs.
func TestRenewPastRetentionKeepsHolder(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := New(WithClock(func() time.Time { return now }))
	ctx := context.Background()
	req := store.ClaimRequest{ID: store.ID{Key: "slow"}, Lease: time.Second, Retention: 2 * time.Second}
	res, err := s.Claim(ctx, req)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatal(res, err)
	}
	for range 5 {
		now = now.Add(900 * time.Millisecond)
		if err := s.Renew(ctx, req.ID, res.Token, time.Second); err != nil {
			t.Fatalf("renew: %v", err)
		}
	}
	if again, _ := s.Claim(ctx, req); again.Outcome != store.InFlight {
		t.Fatalf("claim while the holder renews: %v, want in_flight", again.Outcome)
	}
	if err := s.Complete(ctx, req.ID, res.Token, store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatalf("complete: %v", err)
	}
}
