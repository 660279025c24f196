package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// checkHeap verifies that every record is in exactly one of its shard's expiry
// heap and queue, once, at the index or sequence number it knows; that the heap
// is ordered by the records' deadlines; that the queue is ordered, its items no
// later than their records' deadlines, its tombstones counted and fewer than
// about its records, its head and last item live, its blocks as many as it spans.
func checkHeap(t *testing.T, s *Store) {
	t.Helper()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n := 0
		if len(sh.blocks) != (int(sh.n)+blockLen-1)/blockLen {
			t.Fatalf("shard %d: %d blocks for %d records", i, len(sh.blocks), sh.n)
		}
		for h, r := range sh.records.chains(t, sh) {
			for ; r != 0; r = sh.at(r).next {
				e := sh.at(r)
				if e.self != r {
					t.Fatalf("shard %d: record of %v in slot %d thinks it is in %d", i, e.id, r, e.self)
				}
				if e.hash != h {
					t.Fatalf("shard %d: record of %v chained under hash %x, its hash is %x", i, e.id, h, e.hash)
				}
				n++
			}
		}
		q := &sh.queue
		if int(sh.n) != n {
			t.Fatalf("shard %d: %d slots used for %d records", i, sh.n, n)
		}
		if len(sh.expiry)+q.live() != n {
			t.Fatalf("shard %d: %d heap items and %d queued for %d records", i, len(sh.expiry), q.live(), n)
		}
		dead, last := 0, int64(-1<<63)
		for seq := q.head; seq != q.tail; seq++ {
			it := q.item(seq)
			if it.at < last {
				t.Fatalf("shard %d: queue order broken at %d", i, seq)
			}
			last = it.at
			if it.ref == 0 {
				if seq == q.head || seq == q.tail-1 {
					t.Fatalf("shard %d: tombstone at the queue's end (%d in %d..%d)", i, seq, q.head, q.tail)
				}
				dead++
				continue
			}
			e := sh.at(it.ref)
			if !e.queued || uint32(e.index) != seq || sh.find(sh.records.get(sh, e.hash), e.id) != e || it.at > e.expiresAt {
				t.Fatalf("shard %d: queue item %d (index %d) is not the record of %v", i, seq, e.index, e.id)
			}
		}
		if dead != int(q.dead) || (dead > 17 && dead > q.live()+1) {
			t.Fatalf("shard %d: %d tombstones, %d counted, %d queued", i, dead, q.dead, q.live())
		}
		if span := int(q.tail - q.head&^(chunkLen-1)); len(q.chunks) != (span+chunkLen-1)/chunkLen {
			t.Fatalf("shard %d: %d blocks for %d items from a block's start", i, len(q.chunks), span)
		}
		if len(q.spares) > maxSpares {
			t.Fatalf("shard %d: %d spare blocks", i, len(q.spares))
		}
		for _, c := range q.spares {
			if *c != (chunk{}) {
				t.Fatalf("shard %d: a spare block holds items", i)
			}
		}
		for j, it := range sh.expiry {
			e := sh.at(it.ref)
			if e.queued || int(e.index) != j || sh.find(sh.records.get(sh, e.hash), e.id) != e || it.at != e.expiresAt {
				t.Fatalf("shard %d: heap item %d (index %d) is not the record of %v", i, j, e.index, e.id)
			}
			if p := (j - 1) / 2; j > 0 && sh.expiry[p].at > it.at {
				t.Fatalf("shard %d: heap order broken at %d", i, j)
			}
		}
		sh.mu.Unlock()
	}
}

// chains returns the index's chains, each head's hash to its slot, after
// checking that each word's tag is its record's and that the word is found from
// its home (get), and that the count of words in use is right.
func (x *index) chains(t *testing.T, sh *shard) map[uint64]ref {
	t.Helper()
	m := make(map[uint64]ref)
	for _, w := range x.words {
		if w == 0 {
			continue
		}
		r := ref(uint32(w))
		h := sh.at(r).hash
		if h>>32 != w>>32 || x.get(sh, h) != r {
			t.Fatalf("index word %#x: its record's hash is %#x, found %d from its home", w, h, x.get(sh, h))
		}
		m[h] = r
	}
	if len(m) != x.n {
		t.Fatalf("index: %d words in use, %d counted", len(m), x.n)
	}
	return m
}

// checkSwept sweeps every shard at the store's time and verifies that no record
// past its deadline is left.
func checkSwept(t *testing.T, s *Store) {
	t.Helper()
	at := s.clock()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.sweep(at)
		for _, r := range sh.records.chains(t, sh) {
			for ; r != 0; r = sh.at(r).next {
				if e := sh.at(r); e.expiresAt <= at {
					t.Fatalf("shard %d: %v (deadline %d) left by a sweep at %d", i, e.id, e.expiresAt, at)
				}
			}
		}
		sh.mu.Unlock()
	}
}

// Random claims, takeovers, completions, releases, renewals and expiries keep
// the heap exact: memory is bounded by the records, not by the calls made.
// With a hash mask, IDs share hashes: 1 leaves two chains, 0 one chain of all.
// With 2000 keys the queue spans blocks and fills with tombstones to rebuild.
func TestExpiryHeapStaysExact(t *testing.T) {
	for _, mask := range []uint64{^uint64(0), 1, 0} {
		for _, keys := range []int{50, 2000} {
			t.Run(fmt.Sprint(strconv.FormatUint(mask, 16), "/", keys), func(t *testing.T) { testExpiryHeapStaysExact(t, mask, keys) })
		}
	}
}

func testExpiryHeapStaysExact(t *testing.T, mask uint64, keys int) {
	now := time.Unix(1_700_000_000, 0)
	s := New(WithClock(func() time.Time { return now }), WithShards(2))
	s.hashMask = mask
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	randomOps(t, s, rng, &now, 20000, func() store.ID { return store.ID{Key: strconv.Itoa(rng.IntN(keys))} },
		func(i int) {
			if i%97 == 0 {
				checkHeap(t, s)
			}
			if i%89 == 0 {
				checkSwept(t, s)
			}
		})
	checkHeap(t, s)
	checkSwept(t, s)
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

// randomOps makes n random calls on s for the IDs next returns: claims (with
// leases of 1-5 s and retentions of 5-24 s), completions, releases and renewals
// with the latest token of each ID, and clock steps of up to 2 s on *now; check
// runs after each call.
func randomOps(t *testing.T, s *Store, rng *rand.Rand, now *time.Time, n int, next func() store.ID, check func(i int)) {
	t.Helper()
	ctx := context.Background()
	tokens := map[store.ID]store.Token{}
	for i := range n {
		id := next()
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
			*now = now.Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
		}
		check(i)
	}
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

// Deadlines in order go to the queue, in O(1) each; a completion that moves a
// deadline later keeps the record until then (queued again when its first
// deadline comes up), one that moves it earlier sweeps it at the earlier one, and
// records released out of order leave no more tombstones than records.
func TestQueueDeadlines(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := New(WithClock(func() time.Time { return now }), WithShards(1))
	ctx := context.Background()
	sh := &s.shards[0]
	claim := func(key string, retention time.Duration) store.Token {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimRequest{ID: store.ID{Key: key}, Lease: time.Second, Retention: retention})
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("claim %s: %v %v", key, res.Outcome, err)
		}
		return res.Token
	}
	complete := func(key string, tok store.Token, retention time.Duration) {
		t.Helper()
		if err := s.Complete(ctx, store.ID{Key: key}, tok, store.Response{Status: 200}, retention); err != nil {
			t.Fatal(err)
		}
	}
	tokA := claim("a", time.Minute)
	tokB := claim("b", time.Minute)
	tokC := claim("c", time.Minute)
	if len(sh.expiry) != 0 || sh.queue.live() != 3 {
		t.Fatalf("in-order deadlines: %d in the heap, %d queued; want 0, 3", len(sh.expiry), sh.queue.live())
	}
	complete("a", tokA, time.Hour)   // later, not the last queued: keeps its place
	complete("b", tokB, time.Second) // earlier: out of the queue, into the heap
	complete("c", tokC, 2*time.Hour) // later and last: updated in place
	checkHeap(t, s)
	if len(sh.expiry) != 1 || sh.queue.live() != 2 {
		t.Fatalf("after completions: %d in the heap, %d queued; want 1, 2", len(sh.expiry), sh.queue.live())
	}
	now = now.Add(2 * time.Second)
	claim("d", time.Hour)
	if s.Len() != 3 {
		t.Fatalf("Len %d after b's deadline, want 3", s.Len())
	}
	now = now.Add(2 * time.Minute) // past a's first deadline, not its second
	claim("e", time.Hour)
	checkHeap(t, s)
	if got, _ := s.Inspect(ctx, store.ID{Key: "a"}); got.State != store.StateCompleted {
		t.Fatalf("a after its first deadline: %v, want completed", got.State)
	}
	now = now.Add(time.Hour)
	claim("f", time.Hour)
	checkHeap(t, s)
	if got, _ := s.Inspect(ctx, store.ID{Key: "a"}); got.State != store.StateAbsent || s.Len() != 2 {
		t.Fatalf("a after its second deadline: %v, Len %d; want absent, 2 (c, f)", got.State, s.Len())
	}

	// Release from the middle of a long queue, in a random order.
	rng := rand.New(rand.NewPCG(3, 4))
	toks := map[string]store.Token{}
	for i := range 1000 {
		k := fmt.Sprint("r", i)
		toks[k] = claim(k, 3*time.Hour)
	}
	for _, i := range rng.Perm(1000) {
		k := fmt.Sprint("r", i)
		if err := s.Release(ctx, store.ID{Key: k}, toks[k]); err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 {
			checkHeap(t, s)
		}
	}
	checkHeap(t, s)
	if s.Len() != 2 || sh.queue.len() > 2+17 || len(sh.queue.chunks) > 1 {
		t.Fatalf("after releases: Len %d, %d queue items in %d blocks", s.Len(), sh.queue.len(), len(sh.queue.chunks))
	}
}
