package memory_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

var ctx = context.Background()

// boundReq is a claim of key in scope "tenant" with a one-second lease and a
// one-hour retention.
func boundReq(key string) store.ClaimRequest {
	return store.ClaimRequest{ID: store.ID{Scope: "tenant", Key: key}, Lease: time.Second, Retention: time.Hour}
}

// inFlightSize is what an in-flight record of boundReq(key) is counted for.
func inFlightSize(key string) int64 { return memory.RecordOverhead + int64(len("tenant")+len(key)) }

// fill claims keys k-000, k-001, ... until the store refuses one, and returns
// the claims it made.
func fill(t *testing.T, s *memory.Store) []store.ClaimResult {
	t.Helper()
	var claims []store.ClaimResult
	for i := 0; ; i++ {
		res, err := s.Claim(ctx, boundReq(fmt.Sprintf("k-%03d", i)))
		if errors.Is(err, store.ErrFull) {
			return claims
		}
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("claim %d: %v %v", i, res.Outcome, err)
		}
		if i > 10_000 {
			t.Fatal("the store never filled")
		}
		claims = append(claims, res)
	}
}

// TestBoundRefusesNewClaims: once the records take the bound, a claim of a new
// key is refused with store.ErrFull and leaves nothing, while every key the
// store holds is still answered as before.
func TestBoundRefusesNewClaims(t *testing.T) {
	c := newFakeClock()
	limit := 10 * inFlightSize("k-000")
	s := memory.New(memory.WithClock(c.Now), memory.WithMaxBytes(limit))
	claims := fill(t, s)
	if len(claims) != 10 {
		t.Fatalf("%d claims under a bound of ten records, want 10", len(claims))
	}
	if got := s.Stats(); got.Records != 10 || got.Bytes != limit || got.Refused != 1 || got.MaxBytes != limit {
		t.Fatalf("stats %+v, want 10 records of %d bytes, 1 refused", got, limit)
	}
	_, err := s.Claim(ctx, boundReq("new"))
	if !errors.Is(err, store.ErrFull) || errors.Is(err, store.ErrInvalid) {
		t.Fatalf("claim of a new key in a full store: %v, want store.ErrFull", err)
	}

	// k-000 completes (past the bound: see TestBoundCompletePastBound), k-001
	// stays in flight, k-002's lease expires.
	if err := s.Complete(ctx, boundReq("k-000").ID, claims[0].Token, store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Claim(ctx, boundReq("k-000")); err != nil || res.Outcome != store.Completed || res.Record.Status != 201 {
		t.Fatalf("replay in a full store: %+v %v", res, err)
	}
	if res, err := s.Claim(ctx, boundReq("k-001")); err != nil || res.Outcome != store.InFlight {
		t.Fatalf("in-flight duplicate in a full store: %+v %v", res, err)
	}
	other := boundReq("k-001")
	other.Fingerprint[0] = 1
	if res, err := s.Claim(ctx, other); err != nil || res.Outcome != store.Mismatch {
		t.Fatalf("mismatch in a full store: %+v %v", res, err)
	}
	c.Add(2 * time.Second) // every lease expired, no retention
	if res, err := s.Claim(ctx, boundReq("k-002")); err != nil || res.Outcome != store.Claimed || !res.Takeover {
		t.Fatalf("takeover in a full store: %+v %v", res, err)
	}
	if n := s.Len(); n != 10 {
		t.Fatalf("Len %d after refusals, want 10", n)
	}
}

// TestBoundExpiryFreesBytes: records past their retention, released or
// evicted give their bytes back, and new claims are admitted again; a full
// store sweeps every shard before refusing, so records that expired in shards
// nobody touched since count no more.
func TestBoundExpiryFreesBytes(t *testing.T) {
	c := newFakeClock()
	s := memory.New(memory.WithClock(c.Now), memory.WithMaxBytes(40*inFlightSize("k-000")))
	claims := fill(t, s)
	if err := s.Release(ctx, boundReq("k-000").ID, claims[0].Token); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, boundReq("rel-0")); err != nil {
		t.Fatalf("claim after a release: %v", err)
	}
	if _, _, err := s.Evict(ctx, boundReq("k-001").ID, store.EvictAny); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, boundReq("evi-0")); err != nil {
		t.Fatalf("claim after an eviction: %v", err)
	}
	if _, err := s.Claim(ctx, boundReq("one-0")); !errors.Is(err, store.ErrFull) {
		t.Fatalf("claim in a full store: %v, want ErrFull", err)
	}
	// Once every retention ended the store admits its bound's worth again:
	// the first claim that finds it full-looking sweeps every shard.
	c.Add(time.Hour)
	if again := fill(t, s); len(again) != len(claims) {
		t.Fatalf("%d claims after every record expired, want %d", len(again), len(claims))
	}
	if got := s.Stats(); got.Records != len(claims) || got.Bytes != 40*inFlightSize("k-000") {
		t.Fatalf("after expiry: %+v, want %d records of %d bytes", got, len(claims), inFlightSize("k-000"))
	}
}

// TestBoundCompletePastBound: a Complete whose response takes the store past
// its bound still completes (the side effect happened: refusing would lose its
// answer); new claims are refused meanwhile, and the record is replayed whole.
func TestBoundCompletePastBound(t *testing.T) {
	limit := 4 * inFlightSize("k-000")
	s := memory.New(memory.WithMaxBytes(limit))
	claims := fill(t, s)
	body := make([]byte, 10*limit)
	body[len(body)-1] = 'z'
	id := boundReq("k-003").ID
	if err := s.Complete(ctx, id, claims[3].Token, store.Response{Status: 200, Body: body}, time.Hour); err != nil {
		t.Fatalf("complete past the bound: %v", err)
	}
	if got := s.Stats(); got.Bytes <= limit {
		t.Fatalf("bytes %d after a completion past the bound of %d", got.Bytes, limit)
	}
	res, err := s.Claim(ctx, boundReq("k-003"))
	if err != nil || res.Outcome != store.Completed || len(res.Record.Body) != len(body) || res.Record.Body[len(body)-1] != 'z' {
		t.Fatalf("replay of the record completed past the bound: %v %v", res.Outcome, err)
	}
	if _, err := s.Claim(ctx, boundReq("new")); !errors.Is(err, store.ErrFull) {
		t.Fatalf("new claim past the bound: %v, want ErrFull", err)
	}
}

// TestBoundAccounting pins what a record is counted for through its life.
func TestBoundAccounting(t *testing.T) {
	c := newFakeClock()
	s := memory.New(memory.WithClock(c.Now), memory.WithShards(1))
	r := boundReq("order-42")
	res, err := s.Claim(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	claimed := memory.RecordOverhead + int64(len("tenant")+len("order-42"))
	if got := s.Stats().Bytes; got != claimed {
		t.Fatalf("in flight: %d bytes, want %d", got, claimed)
	}
	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":42}`)}
	if err := s.Complete(ctx, r.ID, res.Token, resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	// The header is kept as uvarint-prefixed name and value: 1+12+1+16 bytes.
	fields := int64(1 + len("Content-Type") + 1 + len("application/json"))
	completed := claimed + memory.ReplayOverhead + memory.HeaderOverhead + 2*fields + int64(len(resp.Body))
	if got := s.Stats().Bytes; got != completed {
		t.Fatalf("completed: %d bytes, want %d", got, completed)
	}
	if _, err := s.Claim(ctx, r); err != nil { // the first replay builds the record counted already
		t.Fatal(err)
	}
	if got := s.Stats().Bytes; got != completed {
		t.Fatalf("replayed: %d bytes, want %d", got, completed)
	}
	c.Add(time.Hour)
	s.Claim(ctx, boundReq("sweeps"))
	if got := s.Stats().Bytes; got != inFlightSize("sweeps") {
		t.Fatalf("after expiry: %d bytes, want %d (the sweeping claim's)", got, inFlightSize("sweeps"))
	}
}

// heapAlloc returns the live heap after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestAccountingMatchesHeap pins the counted bytes against the heap the records
// take: within 15% for records that were replayed (the largest a record gets),
// and never under it for records that were not (they are counted for the copy
// a replay would build).
func TestAccountingMatchesHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("heap measurement skipped in short mode")
	}
	const n = 20_000
	hdr := http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1234567"}}
	for _, tc := range []struct {
		name   string
		resp   *store.Response
		replay bool
	}{
		{"in flight", nil, false},
		{"completed", &store.Response{Status: 201, Header: hdr, Body: make([]byte, 100)}, false},
		{"replayed", &store.Response{Status: 201, Header: hdr, Body: make([]byte, 100)}, true},
		{"replayed without header", &store.Response{Status: 200, Body: make([]byte, 300)}, true},
		{"replayed 4 KiB", &store.Response{Status: 200, Header: hdr, Body: make([]byte, 4000)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("key-%012d", i)
			}
			before := heapAlloc()
			s := memory.New(memory.WithMaxBytes(0))
			for _, k := range keys {
				r := boundReq(k)
				res, err := s.Claim(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				if tc.resp != nil {
					if err := s.Complete(ctx, r.ID, res.Token, *tc.resp, time.Hour); err != nil {
						t.Fatal(err)
					}
				}
				if tc.replay {
					s.Claim(ctx, r)
				}
			}
			keys = nil
			heap := float64(heapAlloc() - before)
			counted := float64(s.Stats().Bytes)
			ratio := counted / heap
			t.Logf("heap %.0f B/record, counted %.0f B/record (%.2f)", heap/n, counted/n, ratio)
			if ratio > 1.15 && tc.replay || ratio < 0.85 || !tc.replay && ratio < 0.95 {
				t.Fatalf("counted %.0f bytes for records that take %.0f on the heap (ratio %.2f)", counted, heap, ratio)
			}
			runtime.KeepAlive(s)
		})
	}
}

// TestDefaultBound: one client sending distinct keys with large answers cannot
// grow a default store past DefaultMaxBytes (by more than the responses in
// flight when it filled): it is refused with store.ErrFull instead.
func TestDefaultBound(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 64 MiB; skipped in short mode")
	}
	s := memory.New()
	body := make([]byte, 256<<10)
	refused := 0
	for i := 0; refused == 0; i++ {
		if i > 2*memory.DefaultMaxBytes/len(body) {
			t.Fatalf("%d answers of %d bytes kept, twice the default bound, none refused", i, len(body))
		}
		r := boundReq(fmt.Sprint("flood-", i))
		res, err := s.Claim(ctx, r)
		if errors.Is(err, store.ErrFull) {
			refused++
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, r.ID, res.Token, store.Response{Status: 200, Body: body}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	got := s.Stats()
	if got.MaxBytes != memory.DefaultMaxBytes || got.Bytes > memory.DefaultMaxBytes+int64(len(body))+4096 {
		t.Fatalf("default store: %+v, want at most DefaultMaxBytes plus one answer", got)
	}
	if got.Bytes < memory.DefaultMaxBytes-int64(len(body))-4096 {
		t.Fatalf("refused at %d bytes, well under the bound of %d", got.Bytes, memory.DefaultMaxBytes)
	}
}

// TestBoundConcurrent: claims, completions and releases racing on every shard
// keep the count exact: it ends at zero when every record is released or
// expired, and the bound holds within one record per shard.
func TestBoundConcurrent(t *testing.T) {
	c := newFakeClock()
	limit := 200 * inFlightSize("w0-k-000")
	s := memory.New(memory.WithClock(c.Now), memory.WithShards(8), memory.WithMaxBytes(limit))
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 500 {
				r := boundReq(fmt.Sprintf("w%d-k-%03d", w, i))
				res, err := s.Claim(ctx, r)
				if errors.Is(err, store.ErrFull) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if i%2 == 0 {
					err = s.Release(ctx, r.ID, res.Token)
				} else {
					err = s.Complete(ctx, r.ID, res.Token, store.Response{Status: 200}, time.Hour)
				}
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	got := s.Stats()
	if got.Refused == 0 || got.Bytes > limit+8*(inFlightSize("w0-k-000")+memory.ReplayOverhead) {
		t.Fatalf("after the storm: %+v (bound %d)", got, limit)
	}
	// Once every record expired, the store admits records up to its bound
	// again: the claim that finds it full-looking sweeps every shard.
	c.Add(2 * time.Hour)
	n := 0
	for ; ; n++ {
		if _, err := s.Claim(ctx, boundReq(fmt.Sprintf("a-%06d", n))); err != nil {
			break
		}
	}
	if got := s.Stats(); n != 200 || got.Records != 200 || got.Bytes != limit {
		t.Fatalf("after expiry: %d claims, %+v; want 200 records of %d bytes", n, got, limit)
	}
}
