package tiered_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/tiered"
)

// TestFaultRedisRestart stops a private Redis in the middle of a concurrent run of
// duplicate requests and starts it again (empty). Every key runs exactly once, no
// request fails while the backstop is up, a phase with both tiers down gives only
// store errors (never an execution or a wrong answer), and the fast path is back
// after the restart.
func TestFaultRedisRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	srv := redistest.StartServer(t)
	c := faultClient(t, srv.Addr)
	back := &probe{Store: anyBackstop(t)}
	s := mustTiered(t, mustRedis(t, c), back, tiered.WithCooldown(20*time.Millisecond), tiered.WithTimeout(testTimeout))
	ctx := t.Context()

	const nKeys, workers = 300, 8
	keys := make([]string, nKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-%d", i)
	}
	a := newApp(s, 5*time.Second, keys) // no lease expires: a second run would be a double execution

	var (
		done     atomic.Int64
		errMu    sync.Mutex
		failures []error
		wg       sync.WaitGroup
	)
	stopAt, restartAt := make(chan struct{}), make(chan struct{})
	var stopOnce, restartOnce sync.Once
	for w := range workers {
		order := rand.New(rand.NewPCG(uint64(w), 7)).Perm(nKeys)
		wg.Go(func() {
			for _, i := range order {
				if err := a.do(ctx, keys[i]); err != nil {
					errMu.Lock()
					failures = append(failures, err)
					errMu.Unlock()
				}
				switch n := done.Add(1); {
				case n == workers*nKeys/3:
					stopOnce.Do(func() { close(stopAt) })
				case n == 2*workers*nKeys/3:
					restartOnce.Do(func() { close(restartAt) })
				}
			}
		})
	}
	<-stopAt
	srv.Stop()
	<-restartAt
	srv.Restart(t)
	wg.Wait()

	if len(failures) > 0 {
		t.Fatalf("%d requests failed with the backstop up, first: %v", len(failures), failures[0])
	}
	for _, k := range keys {
		if n := a.runs[k].Load(); n != 1 {
			t.Errorf("%s ran %d times, want exactly once", k, n)
		}
	}
	st := s.Stats()
	t.Logf("run: %+v, replays %d", st, a.replays.Load())
	if st.FastErrors == 0 {
		t.Error("no fast-path errors counted while Redis was down")
	}

	// Fast path back: the first replays after the restart backfill the empty Redis,
	// the next ones are answered by Redis alone. go-redis needs up to a second to use
	// the restarted server: after PoolSize failed dials its pool fails every call at
	// once and re-dials on its own one-second timer. Wait for the client, then for
	// the store's cooldown. (Sleeping 30 ms alone flaked whenever the run after the
	// restart took less than that second.)
	for deadline := time.Now().Add(5 * time.Second); c.Ping(ctx).Err() != nil; {
		if time.Now().After(deadline) {
			t.Fatal("the client did not reconnect to the restarted Redis within 5 s")
		}
		time.Sleep(10 * time.Millisecond) // polling go-redis's re-dial timer; no event to wait on
	}
	time.Sleep(30 * time.Millisecond) // let the cooldown pass (process clock; no server involved)
	for _, k := range keys {
		if err := a.do(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	before, calls := s.Stats(), back.calls.Load()
	for _, k := range keys {
		if err := a.do(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Stats().FastAnswers - before.FastAnswers; got != nKeys {
		t.Errorf("after restart: %d fast answers for %d replays", got, nKeys)
	}
	if n := back.calls.Load() - calls; n != 0 {
		t.Errorf("after restart: %d backstop calls for cached replays, want 0", n)
	}

	// Both tiers down: new keys fail with store errors and never run; cached
	// replays still need Redis, which is down too, so they fail the same way.
	srv.Stop()
	back.down.Store(true)
	fresh := []string{"new-1", "new-2"}
	b := newApp(s, 5*time.Second, append(fresh, keys...))
	for _, k := range append(fresh, keys[:5]...) {
		err := b.do(ctx, k)
		if !errors.Is(err, errDown) {
			t.Errorf("%s with both tiers down: %v, want the backstop's error", k, err)
		}
	}
	for _, k := range fresh {
		if n := b.runs[k].Load(); n != 0 {
			t.Errorf("%s ran %d times with the backstop down", k, n)
		}
	}
	// Backstop back, Redis still down: everything works through the backstop.
	back.down.Store(false)
	for _, k := range fresh {
		if err := b.do(ctx, k); err != nil || b.runs[k].Load() != 1 {
			t.Errorf("%s with Redis down: %v, runs %d", k, err, b.runs[k].Load())
		}
	}
}

// TestFaultRedisFlushed: Redis loses a completed record; the retry replays from the
// backstop with zero handler executions and Redis is refilled.
func TestFaultRedisFlushed(t *testing.T) {
	srv := redistest.StartServer(t)
	c := faultClient(t, srv.Addr)
	back := &probe{Store: anyBackstop(t)}
	fast := mustRedis(t, c)
	s := mustTiered(t, fast, back, tiered.WithTimeout(testTimeout))
	ctx := t.Context()
	a := newApp(s, 5*time.Second, []string{"k"})
	if err := a.do(ctx, "k"); err != nil || a.runs["k"].Load() != 1 {
		t.Fatalf("first request: %v", err)
	}
	if err := c.FlushAll(ctx).Err(); err != nil { // private server
		t.Fatal(err)
	}
	calls := back.calls.Load()
	if err := a.do(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if a.runs["k"].Load() != 1 || a.replays.Load() != 1 {
		t.Fatalf("after flush: %d runs, %d replays; want 1 and 1", a.runs["k"].Load(), a.replays.Load())
	}
	if back.calls.Load()-calls != 1 {
		t.Errorf("after flush: %d backstop calls, want 1", back.calls.Load()-calls)
	}
	id := store.ID{Scope: "tenant", Key: "k"}
	res, ok, err := fast.Peek(ctx, id, fingerprint("k"))
	if err != nil || !ok || res.Outcome != store.Completed || string(res.Record.Body) != "done:k" {
		t.Fatalf("Redis not refilled: %+v %v %v; stats %+v", res, ok, err, s.Stats())
	}
	if ttl := c.PTTL(ctx, fast.Key(id)).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("refilled TTL %v, want the remaining retention (<= 1m)", ttl)
	}
	calls = back.calls.Load()
	if err := a.do(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if back.calls.Load() != calls {
		t.Error("the replay after refill still went to the backstop")
	}
	if st := s.Stats(); st.Backfills != 1 {
		t.Errorf("stats %+v, want 1 backfill", st)
	}
}

// TestFaultStaleHolder: a holder whose lease was taken over cannot complete in
// either tier, and the replay is the new holder's result.
func TestFaultStaleHolder(t *testing.T) {
	srv := redistest.StartServer(t)
	c := faultClient(t, srv.Addr)
	backstop := anyBackstop(t)
	fast := mustRedis(t, c)
	s := mustTiered(t, fast, backstop, tiered.WithTimeout(testTimeout))
	ctx := t.Context()
	id := store.ID{Scope: "tenant", Key: "k"}
	const lease = 100 * time.Millisecond
	req := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: lease, Retention: time.Minute}

	stale, err := s.Claim(ctx, req)
	if err != nil || stale.Outcome != store.Claimed {
		t.Fatalf("first claim: %+v %v", stale, err)
	}
	time.Sleep(lease + 50*time.Millisecond) // the lease runs on the servers' clocks
	req.Lease = time.Minute                 // the new holder's lease outlasts the rest of the test
	fresh, err := s.Claim(ctx, req)
	if err != nil || fresh.Outcome != store.Claimed || !fresh.Takeover {
		t.Fatalf("takeover: %+v %v", fresh, err)
	}
	staleResp := store.Response{Status: 200, Body: []byte("stale")}
	if err := s.Complete(ctx, id, stale.Token, staleResp, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("stale Complete through tiered: %v, want ErrLeaseLost", err)
	}
	// Each tier refuses on its own.
	if err := backstop.Complete(ctx, id, stale.Token, staleResp, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("stale Complete on the backstop: %v, want ErrLeaseLost", err)
	}
	if err := fast.Complete(ctx, id, stale.Token, staleResp, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("stale Complete on Redis: %v, want ErrLeaseLost", err)
	}
	if r, _ := s.Claim(ctx, req); r.Outcome != store.InFlight {
		t.Errorf("after the stale attempts: %v, want the new holder in flight", r.Outcome)
	}
	want := store.Response{Status: 201, Body: []byte("fresh")}
	if err := s.Complete(ctx, id, fresh.Token, want, time.Minute); err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]store.Store{"tiered": s, "backstop": backstop} {
		r, err := st.Claim(ctx, req)
		if err != nil || r.Outcome != store.Completed || string(r.Record.Body) != "fresh" {
			t.Errorf("%s replay: %+v %v, want the new holder's result", name, r, err)
		}
	}
	if r, ok, err := fast.Peek(ctx, id, req.Fingerprint); err != nil || !ok || string(r.Record.Body) != "fresh" {
		t.Errorf("Redis holds %+v %v %v, want the new holder's result", r, ok, err)
	}
}

// TestFaultRedisHung: a Redis that accepts connections but never answers (SIGSTOP)
// costs each call at most the timeout, then the cooldown skips it entirely; the
// backstop answers throughout, and the fast path resumes after SIGCONT.
func TestFaultRedisHung(t *testing.T) {
	srv := redistest.StartServer(t)
	c := faultClient(t, srv.Addr)
	back := &probe{Store: anyBackstop(t)}
	const timeout = 100 * time.Millisecond
	var (
		errMu    sync.Mutex
		fastErrs []error
	)
	s := mustTiered(t, mustRedis(t, c), back, tiered.WithTimeout(timeout), tiered.WithCooldown(200*time.Millisecond),
		tiered.WithObserver(func(e tiered.Event) {
			if e.Kind == tiered.FastError {
				errMu.Lock()
				fastErrs = append(fastErrs, e.Err)
				errMu.Unlock()
			}
		}))
	ctx := t.Context()
	a := newApp(s, 5*time.Second, []string{"a", "b", "c"})
	if err := a.do(ctx, "a"); err != nil { // connect and load the scripts
		t.Fatal(err)
	}
	st0 := s.Stats()
	pid := srv.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()

	start := time.Now()
	if err := a.do(ctx, "b"); err != nil {
		t.Fatalf("with Redis hung: %v", err)
	}
	if d := time.Since(start); d > time.Second { // without the timeout: the 3 s ReadTimeout
		t.Errorf("request with Redis hung took %v, want about the %v timeout", d, timeout)
	}
	st := s.Stats()
	// The peek times out, the marker write is skipped, the completion is tried.
	if st.FastErrors-st0.FastErrors != 2 || st.FastSkipped-st0.FastSkipped != 1 {
		t.Errorf("stats %+v (before %+v): want 2 timeouts and 1 skip", st, st0)
	}
	errMu.Lock()
	if len(fastErrs) == 0 || !errors.Is(fastErrs[len(fastErrs)-1], tiered.ErrFastTimeout) {
		t.Errorf("fast errors %v, want a timeout last", fastErrs)
	}
	errMu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(250 * time.Millisecond) // cooldown, on the process clock
	before := s.Stats().FastAnswers
	if err := a.do(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if s.Stats().FastAnswers != before+1 {
		t.Errorf("fast path not back after SIGCONT: %+v", s.Stats())
	}
	if a.runs["a"].Load() != 1 || a.runs["b"].Load() != 1 {
		t.Error("a key ran more than once")
	}
}
