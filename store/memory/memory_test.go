package memory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/storetest"
)

// newFakeClock returns a manual clock; its Add is the suite's Wait.
func newFakeClock() *testclock.Clock { return testclock.New(time.Unix(1_700_000_000, 0)) }

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		c := newFakeClock()
		return storetest.Subject{Store: memory.New(memory.WithClock(c.Now)), Wait: c.Add}
	})
}

func TestWaiting(t *testing.T) {
	storetest.RunWaiting(t, func(t *testing.T) storetest.WaitSubject {
		return storetest.WaitSubject{Store: memory.New()}
	})
}

func TestConformanceRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock run of the suite skipped in short mode")
	}
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: memory.New(memory.WithShards(1))}
	})
}

// TestSweepBoundsMemory shows that expired records are dropped without any read
// of their keys: memory is bounded by the live keys.
func TestSweepBoundsMemory(t *testing.T) {
	c := newFakeClock()
	s := memory.New(memory.WithClock(c.Now), memory.WithShards(4))
	ctx := context.Background()
	claim := func(key string, retention time.Duration) {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimRequest{ID: store.ID{Key: key}, Lease: time.Second, Retention: retention})
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("claim %s: %v %v", key, res.Outcome, err)
		}
		if err := s.Complete(ctx, store.ID{Key: key}, res.Token, store.Response{Status: 200}, retention); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 1000 {
		claim(fmt.Sprint("old-", i), time.Minute)
	}
	claim("keep", time.Hour)
	if n := s.Len(); n != 1001 {
		t.Fatalf("Len %d, want 1001", n)
	}
	c.Add(2 * time.Minute)
	// Writes to every shard sweep it.
	for i := range 64 {
		claim(fmt.Sprint("new-", i), time.Minute)
	}
	if n := s.Len(); n != 65 {
		t.Fatalf("after expiry Len %d, want 65 (64 new + keep)", n)
	}
}

func TestCompleteCopiesBody(t *testing.T) {
	s := memory.New()
	ctx := context.Background()
	id := store.ID{Key: "k"}
	res, _ := s.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Second, Retention: time.Hour})
	body := []byte("original")
	if err := s.Complete(ctx, id, res.Token, store.Response{Status: 200, Body: body}, time.Hour); err != nil {
		t.Fatal(err)
	}
	copy(body, "XXXXXXXX") // the caller reuses its buffer
	got, _ := s.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Second, Retention: time.Hour})
	if string(got.Record.Body) != "original" {
		t.Fatalf("stored body changed with the caller's buffer: %q", got.Record.Body)
	}
}

func TestCancelledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := memory.New()
	if _, err := s.Claim(ctx, store.ClaimRequest{ID: store.ID{Key: "k"}, Lease: time.Second, Retention: time.Hour}); err == nil {
		t.Fatal("claim with a cancelled context succeeded")
	}
	if s.Len() != 0 {
		t.Fatal("cancelled claim left a record")
	}
}

func BenchmarkClaimComplete(b *testing.B) {
	s := memory.New(memory.WithMaxBytes(1 << 40)) // keeps every key of a run; the bound is still checked
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		tok := store.NewToken()
		for pb.Next() {
			i++
			id := store.ID{Scope: tok.String(), Key: fmt.Sprint(i)}
			res, err := s.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Second, Retention: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, id, res.Token, store.Response{Status: 200, Body: []byte("ok")}, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkClaimCompleteSteady is the middleware's first-execution path at steady
// state: the clock moves so that about liveKeys records are live, and every
// claim also sweeps one expired record.
func BenchmarkClaimCompleteSteady(b *testing.B) {
	const liveKeys = 4096
	c := newFakeClock()
	s := memory.New(memory.WithClock(c.Now))
	keys := make([]string, 2*liveKeys)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	ctx := context.Background()
	resp := store.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"balanceCents":98766,"aggregateVersion":42}`)}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.Add(24 * time.Hour / liveKeys)
		id := store.ID{Scope: "tenant-1", Key: keys[i%len(keys)]}
		i++
		res, err := s.Claim(ctx, store.ClaimRequest{ID: id, Lease: 10 * time.Second, Retention: 24 * time.Hour})
		if err != nil || res.Outcome != store.Claimed {
			b.Fatal(res.Outcome, err)
		}
		if err := s.Complete(ctx, id, res.Token, resp, 24*time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWaiting(b *testing.B) { storetest.BenchWaiting(b, memory.New()) }
