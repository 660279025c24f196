package tiered_test

import (
	"testing"
	"time"

	"github.com/idemkey/idemkey/idem/idemtest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/storetest"
	"github.com/idemkey/idemkey/store/tiered"
)

// TestConformanceMemoryCachePostgres runs the suite on the memory store as the
// cache in front of Postgres, each subtest in its own schema and cache.
func TestConformanceMemoryCachePostgres(t *testing.T) {
	pool := pgPool(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: mustTiered(t, memory.New(), postgresBackstop(t, pool))}
	})
}

// TestMemoryCacheRoundTrips: with the memory store as the cache, a replay, a
// duplicate in flight and a mismatch against a completed record cost no
// Postgres call; a record Postgres replays once is copied in and answered from
// the process after that.
func TestMemoryCacheRoundTrips(t *testing.T) {
	back := &probe{Store: postgresBackstop(t, pgPool(t))}
	s := mustTiered(t, memory.New(), back)
	ctx := t.Context()
	id := store.ID{Scope: "tenant", Key: "k"}
	req := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Second, Retention: time.Minute}
	claim := func(r store.ClaimRequest, want store.Outcome, calls int64) store.ClaimResult {
		t.Helper()
		b0 := back.calls.Load()
		res, err := s.Claim(ctx, r)
		if err != nil || res.Outcome != want {
			t.Fatalf("claim: %v %v, want %v", res.Outcome, err, want)
		}
		if n := back.calls.Load() - b0; n != calls {
			t.Fatalf("%v: %d Postgres calls, want %d", want, n, calls)
		}
		return res
	}
	first := claim(req, store.Claimed, 1)
	claim(req, store.InFlight, 0)
	if err := s.Complete(ctx, id, first.Token, store.Response{Status: 201, Body: []byte("ok")}, time.Minute); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		claim(req, store.Completed, 0)
	}
	other := req
	other.Fingerprint = fingerprint("b")
	claim(other, store.Mismatch, 0)

	// Another process's cache (a replica's) learns the record from Postgres once.
	replica := mustTiered(t, memory.New(), back)
	b0 := back.calls.Load()
	for range 3 {
		if res, err := replica.Claim(ctx, req); err != nil || res.Outcome != store.Completed || string(res.Record.Body) != "ok" {
			t.Fatalf("replica replay: %v %v", res.Outcome, err)
		}
	}
	if n := back.calls.Load() - b0; n != 1 {
		t.Fatalf("3 replays on a replica: %d Postgres calls, want 1 (then the backfilled copy)", n)
	}
	if st := replica.Stats(); st.Backfills != 1 || st.FastAnswers != 2 || st.FastErrors != 0 {
		t.Fatalf("replica stats %+v, want 1 backfill and 2 fast answers", st)
	}
}

// TestIdemMemoryCachePostgres runs package idem's suite over the memory cache
// in front of Postgres.
func TestIdemMemoryCachePostgres(t *testing.T) {
	pool := pgPool(t)
	idemtest.Run(t, func(t *testing.T) store.Store {
		return mustTiered(t, memory.New(), postgresBackstop(t, pool), tiered.WithTimeout(testTimeout))
	})
}

// TestWaitingMemoryCachePostgres runs the waiting duplicates over the memory
// cache in front of Postgres: the waiter wakes on Postgres's notification, then
// on the end of the cache's marker.
func TestWaitingMemoryCachePostgres(t *testing.T) {
	pool := pgPool(t)
	storetest.RunWaiting(t, func(t *testing.T) storetest.WaitSubject {
		pg := postgresBackstop(t, pool, postgres.WithWaiterIdle(0))
		return storetest.WaitSubject{Store: mustTiered(t, memory.New(), pg),
			Waiting: func() int { return int(pg.Stats().Waiters) }}
	})
}
