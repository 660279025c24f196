package tiered_test

import (
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/storetest"
	"github.com/idemkey/idemkey/store/tiered"
)

// TestConformancePostgres runs the suite on the real pair: shared Redis in front of
// shared Postgres, each subtest in its own key prefix and schema.
func TestConformancePostgres(t *testing.T) {
	c := redistest.Shared(t)
	pool := pgPool(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
		t.Cleanup(fast.StopWaiters)
		return storetest.Subject{Store: mustTiered(t, fast, postgresBackstop(t, pool), tiered.WithTimeout(testTimeout))}
	})
}

// TestConformanceMemory runs the suite with the memory store as the backstop: the
// tiered store works with any authoritative store.
func TestConformanceMemory(t *testing.T) {
	c := redistest.Shared(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
		t.Cleanup(fast.StopWaiters)
		return storetest.Subject{Store: mustTiered(t, fast, memory.New(), tiered.WithTimeout(testTimeout))}
	})
}

// TestRoundTrips counts, per step, the Redis commands (go-redis hook) and the
// backstop calls. The replay is 1 Redis round trip and 0 backstop calls.
func TestRoundTrips(t *testing.T) {
	shared := redistest.Shared(t)
	c := goredis.NewClient(shared.Options())
	t.Cleanup(func() { _ = c.Close() })
	hook := &redistest.CommandCounter{}
	c.AddHook(hook)
	back := &probe{Store: anyBackstop(t)}
	fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, shared)))
	s := mustTiered(t, fast, back, tiered.WithTimeout(testTimeout))
	ctx := t.Context()

	warm := store.ID{Scope: "warm", Key: "k"} // load every script once
	r, err := s.Claim(ctx, store.ClaimRequest{ID: warm, Fingerprint: fingerprint("w"), Lease: time.Second, Retention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Renew(ctx, warm, r.Token, time.Second)
	_ = s.Complete(ctx, warm, r.Token, store.Response{Status: 200}, time.Minute)
	_ = s.Release(ctx, warm, r.Token)
	_ = fast.Fill(ctx, warm, &store.Record{Response: store.Response{Status: 200}}, time.Second)

	id := store.ID{Scope: "tenant", Key: "k"}
	req := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Second, Retention: time.Minute}
	var tok store.Token
	steps := []struct {
		name          string
		do            func() (store.Outcome, error)
		want          store.Outcome
		redis, backst int64
	}{
		{"first claim: peek, backstop claim, marker", func() (store.Outcome, error) {
			r, err := s.Claim(ctx, req)
			tok = r.Token
			return r.Outcome, err
		}, store.Claimed, 2, 1},
		{"duplicate in flight: marker answers (GET, then PTTL for Retry-After)", func() (store.Outcome, error) {
			r, err := s.Claim(ctx, req)
			return r.Outcome, err
		}, store.InFlight, 2, 0},
		{"renew: backstop then marker", func() (store.Outcome, error) {
			return 0, s.Renew(ctx, id, tok, 2*time.Second)
		}, 0, 1, 1},
		{"complete: backstop then cache", func() (store.Outcome, error) {
			return 0, s.Complete(ctx, id, tok, store.Response{Status: 201, Body: []byte("ok")}, time.Minute)
		}, 0, 1, 1},
		{"replay", func() (store.Outcome, error) {
			r, err := s.Claim(ctx, req)
			return r.Outcome, err
		}, store.Completed, 1, 0},
		{"mismatch against the cached record", func() (store.Outcome, error) {
			r, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("b"), Lease: time.Second, Retention: time.Minute})
			return r.Outcome, err
		}, store.Mismatch, 1, 0},
	}
	for _, st := range steps {
		r0, b0 := hook.Count(), back.calls.Load()
		got, err := st.do()
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got != st.want {
			t.Errorf("%s: outcome %v, want %v", st.name, got, st.want)
		}
		if n := hook.Count() - r0; n != st.redis {
			t.Errorf("%s: %d Redis round trips, want %d", st.name, n, st.redis)
		}
		if n := back.calls.Load() - b0; n != st.backst {
			t.Errorf("%s: %d backstop calls, want %d", st.name, n, st.backst)
		}
	}
	if st := s.Stats(); st.FastErrors != 0 {
		t.Errorf("fast errors %d, want 0", st.FastErrors)
	}
}

// TestMissingMarkerIsNotNew: a record the backstop holds but Redis lost is never
// taken as new; the backstop answers.
func TestMissingMarkerIsNotNew(t *testing.T) {
	c := redistest.Shared(t)
	back := &probe{Store: memory.New()}
	fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
	s := mustTiered(t, fast, back, tiered.WithTimeout(testTimeout))
	ctx := t.Context()
	id := store.ID{Scope: "tenant", Key: "k"}
	req := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
	if r, err := s.Claim(ctx, req); err != nil || r.Outcome != store.Claimed {
		t.Fatalf("claim: %+v %v", r, err)
	}
	c.Del(ctx, fast.Key(id))
	r, err := s.Claim(ctx, req)
	if err != nil || r.Outcome != store.InFlight {
		t.Fatalf("claim with the marker gone: %+v %v, want in flight from the backstop", r, err)
	}
	if r2, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("b"), Lease: time.Minute, Retention: time.Hour}); err != nil || r2.Outcome != store.Mismatch {
		t.Fatalf("other payload with the marker gone: %+v %v, want mismatch", r2, err)
	}
}

// TestCorruptCacheFallsBack: garbage under a key in Redis costs a fast-path error,
// not a wrong answer, and does not switch the fast path off for other keys.
func TestCorruptCacheFallsBack(t *testing.T) {
	c := redistest.Shared(t)
	var events []tiered.Event
	fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
	s := mustTiered(t, fast, memory.New(), tiered.WithTimeout(testTimeout), tiered.WithObserver(func(e tiered.Event) { events = append(events, e) }))
	ctx := t.Context()
	id := store.ID{Scope: "tenant", Key: "k"}
	c.Set(ctx, fast.Key(id), "garbage", time.Minute)
	r, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Second, Retention: time.Minute})
	if err != nil || r.Outcome != store.Claimed {
		t.Fatalf("claim: %+v %v, want claimed by the backstop", r, err)
	}
	if len(events) == 0 || events[0].Kind != tiered.FastError || !errors.Is(events[0].Err, store.ErrCorrupt) {
		t.Fatalf("events %+v, want a fast error wrapping ErrCorrupt first", events)
	}
	// The marker replaced the garbage, and the fast path is still on.
	if r, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Second, Retention: time.Minute}); err != nil || r.Outcome != store.InFlight {
		t.Fatalf("second claim: %+v %v", r, err)
	}
	if st := s.Stats(); st.FastAnswers != 1 || st.FastSkipped != 0 {
		t.Errorf("stats %+v, want 1 fast answer, no skips", st)
	}
}

// TestNewRefusesNil: a nil cache or backstop, or a nil pointer in either
// interface, is refused by New (ErrInvalid), never a panic at the first call.
func TestNewRefusesNil(t *testing.T) {
	for _, tc := range []struct {
		name string
		fast tiered.Cache
		back store.Store
	}{
		{"nil cache", nil, memory.New()},
		{"typed-nil cache", (*redis.Store)(nil), memory.New()},
		{"nil backstop", mustRedis(t, goredis.NewClient(&goredis.Options{})), nil},
		{"typed-nil backstop", mustRedis(t, goredis.NewClient(&goredis.Options{})), (*postgres.Store)(nil)},
		{"both nil", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := tiered.New(tc.fast, tc.back)
			if !errors.Is(err, store.ErrInvalid) || s != nil {
				t.Fatalf("New: %v, %v; want ErrInvalid", s, err)
			}
		})
	}
}

// TestWaiting runs the middleware's waiting duplicates over the tiered store
// (Redis in front of Postgres): the backstop's LISTEN/NOTIFY wakes them.
func TestWaiting(t *testing.T) {
	c := redistest.Shared(t)
	pool := pgPool(t)
	storetest.RunWaiting(t, func(t *testing.T) storetest.WaitSubject {
		fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)), redis.WithWaiterIdle(0))
		t.Cleanup(fast.StopWaiters)
		pg := postgresBackstop(t, pool, postgres.WithWaiterIdle(0))
		t.Cleanup(pg.StopWaiters)
		return storetest.WaitSubject{Store: mustTiered(t, fast, pg, tiered.WithTimeout(testTimeout)),
			Waiting: func() int { return int(fast.Stats().Waiters + pg.Stats().Waiters) }}
	})
}

func BenchmarkWaiting(b *testing.B) {
	c := redistest.Shared(b)
	pg := postgresBackstop(b, pgPool(b))
	b.Cleanup(pg.StopWaiters)
	fast := mustRedis(b, c, redis.WithPrefix(redistest.Prefix(b, c)))
	b.Cleanup(fast.StopWaiters)
	storetest.BenchWaiting(b, mustTiered(b, fast, pg, tiered.WithTimeout(testTimeout)))
}
