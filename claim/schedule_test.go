package claim

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// renewLog is a store that records when each token's renewals arrive, and can
// delay the claims of a key.
type renewLog struct {
	store.Store
	mu   sync.Mutex
	at   map[store.Token][]time.Time
	slow map[string]time.Duration
}

func (r *renewLog) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	r.mu.Lock()
	d := r.slow[req.Key]
	r.mu.Unlock()
	time.Sleep(d)
	return r.Store.Claim(ctx, req)
}

// delay makes the claims of key take d.
func (r *renewLog) delay(key string, d time.Duration) {
	r.mu.Lock()
	r.slow[key] = d
	r.mu.Unlock()
}

func (r *renewLog) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	r.mu.Lock()
	r.at[tok] = append(r.at[tok], time.Now())
	r.mu.Unlock()
	return r.Store.Renew(ctx, id, tok, lease)
}

// renewals returns when tok's renewals arrived, as offsets from t0.
func (r *renewLog) renewals(tok store.Token, t0 time.Time) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var d []time.Duration
	for _, at := range r.at[tok] {
		d = append(d, at.Sub(t0))
	}
	return d
}

// schedClaimer returns a Claimer on the real clock (so with a scheduler) over a
// renewLog, lease 12 s: sweeps every second, first renewals 4 s after the send.
func schedClaimer(t *testing.T) (*Claimer, *renewLog) {
	t.Helper()
	st := &renewLog{Store: memory.New(), at: map[store.Token][]time.Time{}, slow: map[string]time.Duration{}}
	cl, err := New(Config{Store: st, Lease: 12 * time.Second, Retention: time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if cl.sched == nil {
		t.Fatal("no scheduler on the real clock")
	}
	return cl, st
}

// start claims key and starts e on it; it returns the claim's token and send time.
func start(t *testing.T, cl *Claimer, e *Execution, key string) (store.Token, time.Time) {
	t.Helper()
	res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: store.ID{Key: key}})
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("claim %q: %+v, %v", key, res, err)
	}
	e.Start(cl, t.Context(), store.ID{Key: key}, res.Token, sent, nil)
	return res.Token, sent
}

// young reports whether e is linked in a young list; timer whether a timer of
// its own was ever made (both read under their locks: a sweep writes them).
func young(e *Execution) bool {
	if e.ylist == nil {
		return false
	}
	e.ylist.mu.Lock()
	defer e.ylist.mu.Unlock()
	return e.linked
}

func timer(e *Execution) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.timer != nil
}

func equalOffsets(got, want []time.Duration) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// An execution started while the sweep timer runs arms no timer of its own; one
// still running at the next sweep is renewed exactly a third of the lease after
// its claim was sent, and every third after, as one that armed its timer at once.
func TestYoungExecutionRenewedFromSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl, st := schedClaimer(t)
		var first, yng Execution
		start(t, cl, &first, "first") // the sweep timer was idle: first arms its own timer
		if young(&first) || !timer(&first) || !cl.sched.armed.Load() {
			t.Fatalf("first execution: linked %v, timer %v, sweeps armed %v; want its own timer, sweeps armed",
				young(&first), timer(&first), cl.sched.armed.Load())
		}
		time.Sleep(300 * time.Millisecond)
		tok, sent := start(t, cl, &yng, "young")
		if !young(&yng) || timer(&yng) {
			t.Fatalf("young execution: linked %v, timer %v; want linked, no timer", young(&yng), timer(&yng))
		}
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if got := st.renewals(tok, sent); !equalOffsets(got, []time.Duration{4 * time.Second, 8 * time.Second}) {
			t.Fatalf("young execution renewed at %v after its send, want 4s and 8s", got)
		}
		if !yng.Stop() || !first.Stop() {
			t.Fatal("executions not reusable after Stop")
		}
		time.Sleep(2 * time.Second) // a sweep finds nothing: the timer stops
		synctest.Wait()
		if cl.sched.armed.Load() {
			t.Fatal("sweep timer still armed with no execution running")
		}
	})
}

// An execution that stops before a sweep found it leaves no timer and no
// renewal, and is reusable; started again it is young again.
func TestYoungExecutionStoppedUnscheduled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl, st := schedClaimer(t)
		var first, e Execution
		start(t, cl, &first, "first")
		for i, key := range []string{"a", "b"} {
			time.Sleep(100 * time.Millisecond)
			tok, _ := start(t, cl, &e, key)
			if !young(&e) {
				t.Fatalf("run %d: not young", i)
			}
			time.Sleep(100 * time.Millisecond)
			if reusable := e.Stop(); !reusable || young(&e) || timer(&e) {
				t.Fatalf("run %d: reusable %v, linked %v, timer %v after Stop", i, reusable, young(&e), timer(&e))
			}
			if got := st.renewals(tok, time.Time{}); len(got) != 0 {
				t.Fatalf("run %d: %d renewals", i, len(got))
			}
			e.Reset()
		}
		first.Stop()
	})
}

// A claim sent before the latest sweep (a slow store) arms its execution's timer
// at once: a sweep could find it too late.
func TestSlowClaimArmsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl, st := schedClaimer(t)
		var first, slow Execution
		var others [4]Execution
		start(t, cl, &first, "first")
		// Young executions keep the sweeps going meanwhile (at 1 s to 4 s).
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := range others {
				time.Sleep(500 * time.Millisecond)
				id := store.ID{Key: fmt.Sprint("other", i)}
				res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
				if err != nil {
					t.Error(err)
					return
				}
				others[i].Start(cl, t.Context(), id, res.Token, sent, nil)
				time.Sleep(500 * time.Millisecond)
			}
		}()
		// The first renewal is due at 4 s, when the claim has not been answered yet:
		// it is sent at once on the answer (a sweep would send it at 5 s).
		st.delay("slow", 4500*time.Millisecond)
		tok, sent := start(t, cl, &slow, "slow")
		<-done
		for i := range others {
			others[i].Stop()
		}
		if young(&slow) || !timer(&slow) {
			t.Fatalf("slow claim: linked %v, timer %v; want its own timer", young(&slow), timer(&slow))
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := st.renewals(tok, sent); !equalOffsets(got, []time.Duration{4500 * time.Millisecond}) {
			t.Fatalf("slow claim renewed at %v after its send, want 4.5s (on the answer)", got)
		}
		slow.Stop()
		first.Stop()
	})
}

// A young execution released before a sweep found it (a hijacked connection)
// is not scheduled by the sweep.
func TestYoungExecutionReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl, st := schedClaimer(t)
		var first, e Execution
		start(t, cl, &first, "first")
		time.Sleep(100 * time.Millisecond)
		tok, _ := start(t, cl, &e, "released")
		if err := e.Release(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if timer(&e) || len(st.renewals(tok, time.Time{})) != 0 {
			t.Fatalf("released execution: timer %v, renewals %v", timer(&e), st.renewals(tok, time.Time{}))
		}
		if !e.Stop() {
			t.Fatal("released execution not reusable")
		}
		first.Stop()
	})
}

// The sweep timer is set before a sweep can read it: the wake that makes it is
// a request's goroutine, which goes on at once, so nothing but the timer itself
// orders its write before the sweep's Reset (run with -race; a sweep that ran
// before the write would Reset a nil timer and crash the process). Real clock:
// synctest's Wait would order the writes itself.
func TestSweepTimerSetBeforeSweep(t *testing.T) {
	cl, err := New(Config{Store: memory.New(), Lease: MinLease, Retention: MinLease,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var waker, yng Execution
	res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: store.ID{Key: "waker"}})
	if err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	started := make(chan struct{})
	go func() {
		defer close(started)
		waker.Start(cl, t.Context(), store.ID{Key: "waker"}, res.Token, sent, nil) // arms the sweeps
		<-hold
	}()
	for !cl.sched.armed.Load() { // synchronises with the wake's CompareAndSwap only
		runtime.Gosched()
	}
	start(t, cl, &yng, "young") // linked: the sweep finds it and Resets its timer
	for young(&yng) {
		runtime.Gosched()
	}
	yng.Stop()
	close(hold)
	<-started
	waker.Stop()
}

// slowArmClock is the real clock (synctest's in a bubble), but arming a timer
// takes it armDelay once slow is set (after the timer is armed, so the delay is
// the time the sweep spends on this execution before it reaches the next: a
// loaded machine, an allocation's collection assist, many executions).
type slowArmClock struct {
	slow     sync.Mutex
	armDelay time.Duration
}

func (c *slowArmClock) AfterFunc(d time.Duration, f func()) Timer {
	t := time.AfterFunc(d, f)
	c.slow.Lock()
	delay := c.armDelay
	c.slow.Unlock()
	time.Sleep(delay)
	return t
}

func (c *slowArmClock) setDelay(d time.Duration) {
	c.slow.Lock()
	c.armDelay = d
	c.slow.Unlock()
}

// slowSweepClaimer is schedClaimer whose timers are armed on a slowArmClock,
// with the scheduler the real clock would have.
func slowSweepClaimer(t *testing.T) (*Claimer, *renewLog, *slowArmClock) {
	t.Helper()
	st := &renewLog{Store: memory.New(), at: map[store.Token][]time.Time{}, slow: map[string]time.Duration{}}
	clock := &slowArmClock{}
	cl, err := New(Config{Store: st, Lease: 12 * time.Second, Retention: time.Hour, Clock: clock,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	cl.sched = newScheduler(cl)
	return cl, st, clock
}

// inList makes e's young list the scheduler's list i.
func inList(cl *Claimer, e *Execution, i int) {
	e.ysched, e.ylist = cl.sched, &cl.sched.lists[i]
}

// A sweep that takes long to arm its executions (here 300 ms each) still
// schedules each first renewal a third of the lease after its claim's send, not
// that long after plus the time the sweep spent before reaching it.
func TestSlowSweepArmsFromSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl, st, clock := slowSweepClaimer(t)
		var first Execution
		start(t, cl, &first, "first") // wakes the sweeps: one at 1 s
		time.Sleep(100 * time.Millisecond)
		var es [5]Execution
		var toks [5]store.Token
		var sents [5]time.Time
		for i := range es {
			toks[i], sents[i] = start(t, cl, &es[i], fmt.Sprint("young", i))
		}
		clock.setDelay(300 * time.Millisecond)
		time.Sleep(6 * time.Second) // the sweep at 1 s arms es until 2.5 s
		synctest.Wait()
		for i := range es {
			if got := st.renewals(toks[i], sents[i]); len(got) == 0 || got[0] != 4*time.Second {
				t.Errorf("execution %d: renewed at %v after its send, want first at 4s", i, got)
			}
			es[i].Stop()
		}
		first.Stop()
	})
}

// An execution linked while a sweep runs long (3.5 s arming others, the
// lease's period a second) is found by the next sweep in time: the sweeps'
// period is counted from each sweep's start, not its end.
func TestSlowSweepKeepsPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl, st, clock := slowSweepClaimer(t)
		var first Execution
		start(t, cl, &first, "first") // wakes the sweeps: one at 1 s
		time.Sleep(900 * time.Millisecond)
		var es [10]Execution // first renewals due at 4.9 s
		for i := range es {
			inList(cl, &es[i], youngLists-1) // swept last
			start(t, cl, &es[i], fmt.Sprint("old", i))
		}
		clock.setDelay(350 * time.Millisecond)
		time.Sleep(200 * time.Millisecond) // the sweep at 1 s arms es until 4.5 s
		var y Execution                    // sent at 1.1 s: due at 5.1 s
		inList(cl, &y, 0)                  // swept already
		tok, sent := start(t, cl, &y, "young")
		if !young(&y) {
			t.Fatal("not young")
		}
		time.Sleep(3500 * time.Millisecond)
		clock.setDelay(0) // the sweep arming es has ended
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if got := st.renewals(tok, sent); len(got) == 0 || got[0] != 4*time.Second {
			t.Errorf("young execution renewed at %v after its send, want first at 4s", got)
		}
		for i := range es {
			es[i].Stop()
		}
		y.Stop()
		first.Stop()
	})
}

// Executions started at every phase of the sweeps (one a millisecond over
// several periods, some while sweeps stop and restart), at the shortest lease,
// running for up to three leases: each is renewed a third of the lease after
// its claim's send at the latest, then every third of the lease, and never
// after it stopped.
func TestEveryPhaseRenewedInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &renewLog{Store: memory.New(), at: map[store.Token][]time.Time{}, slow: map[string]time.Duration{}}
		cl, err := New(Config{Store: st, Lease: MinLease, Retention: time.Hour,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		third := MinLease / 3
		type run struct {
			tok           store.Token
			sent, stopped time.Time
		}
		runs := make(chan run, 1000)
		var wg sync.WaitGroup
		for i := range 400 {
			if i%100 == 99 {
				time.Sleep(3 * MinLease) // the sweeps stop meanwhile
				synctest.Wait()
			}
			time.Sleep(time.Millisecond)
			wg.Go(func() {
				var e Execution
				tok, sent := start(t, cl, &e, fmt.Sprint("k", i))
				time.Sleep(time.Duration(i*7919%300) * time.Millisecond)
				e.Stop()
				runs <- run{tok, sent, time.Now()}
			})
		}
		wg.Wait()
		time.Sleep(MinLease) // no renewal comes after Stop
		synctest.Wait()
		close(runs)
		renewed := 0
		for r := range runs {
			renewed += len(st.renewals(r.tok, r.sent))
			prev := r.sent
			for _, at := range st.renewals(r.tok, r.sent) {
				at := r.sent.Add(at)
				if at.Sub(prev) > third || at.After(r.stopped) {
					t.Fatalf("claim sent at %v, stopped %v after: renewals at %v after its send",
						r.sent, r.stopped.Sub(r.sent), st.renewals(r.tok, r.sent))
				}
				prev = at
			}
			if r.stopped.Sub(prev) > third {
				t.Fatalf("claim sent at %v, stopped %v after: renewals at %v after its send (a gap over a third)",
					r.sent, r.stopped.Sub(r.sent), st.renewals(r.tok, r.sent))
			}
		}
		if renewed < 1000 {
			t.Fatalf("%d renewals in all: the executions did not run long", renewed)
		}
	})
}

// Pooled executions reused at once after Stop and Reset (some stopped young,
// some after the sweep armed them, some after renewals, some released while
// they run), at every phase of the sweeps: each claim is renewed only while it
// runs (until its release), within a third of the lease
// of its send and of each renewal, and a timer left from an earlier claim never
// renews a later one.
func TestPooledExecutionsRenewedInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &renewLog{Store: memory.New(), at: map[store.Token][]time.Time{}, slow: map[string]time.Duration{}}
		cl, err := New(Config{Store: st, Lease: MinLease, Retention: time.Hour,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		pool := make(chan *Execution, 64)
		for range cap(pool) {
			pool <- new(Execution)
		}
		type run struct {
			tok           store.Token
			sent, stopped time.Time
		}
		runs := make(chan run, 4000)
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := range 150 {
					var e *Execution
					select {
					case e = <-pool:
					default:
						e = new(Execution)
					}
					tok, sent := start(t, cl, e, fmt.Sprint(w, "-", i))
					time.Sleep(time.Duration((w*131+i*7919)%90) * time.Millisecond)
					end := time.Now()
					if i%7 == 3 { // released while it runs (a hijacked connection): renewals stop
						if err := e.Release(); err != nil {
							t.Error(err)
						}
						time.Sleep(time.Duration(i%40) * time.Millisecond)
					}
					reusable := e.Stop()
					runs <- run{tok, sent, end}
					if reusable {
						e.Reset()
						select {
						case pool <- e:
						default:
						}
					}
					if i%50 == 49 {
						time.Sleep(2 * MinLease) // the sweeps stop
					}
				}
			})
		}
		wg.Wait()
		time.Sleep(MinLease)
		synctest.Wait()
		close(runs)
		third, renewed := MinLease/3, 0
		for r := range runs {
			got := st.renewals(r.tok, r.sent)
			renewed += len(got)
			prev := time.Duration(0)
			for _, at := range got {
				if at-prev > third || at < 0 || r.sent.Add(at).After(r.stopped) {
					t.Fatalf("claim run %v: renewals at %v after its send", r.stopped.Sub(r.sent), got)
				}
				prev = at
			}
			if r.stopped.Sub(r.sent)-prev > third {
				t.Fatalf("claim run %v: renewals at %v after its send (a gap over a third)", r.stopped.Sub(r.sent), got)
			}
		}
		if renewed < 1000 {
			t.Fatalf("%d renewals in all", renewed)
		}
	})
}
