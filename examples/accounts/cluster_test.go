package accounts

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/internal/testclock"
)

// newClusterEnv is an env on a simulated three-node cluster (node 0 leading) with two
// replicas, each with its own client configured with a follower's address first.
func newClusterEnv(t *testing.T, mk func(*testing.T, *testclock.Clock, time.Duration) Projection) (*env, *celeriantsim.Cluster, []*pod) {
	clock := newFakeClock()
	cl, err := celeriantsim.NewCluster(3, celeriantsim.Options{Now: clock.Now, PageBatches: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	e := &env{t: t, clock: clock, sim: cl.Sim, log: cl.Sim, mk: mk}
	addrs := cl.Addrs()
	var pods []*pod
	for i := range 2 {
		c, err := celeriant.New(celeriant.Config{Addrs: []string{addrs[1+i], addrs[0]}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		pods = append(pods, e.podOn(c, 0))
	}
	return e, cl, pods
}

// TestReferenceScenariosAcrossLeaderChanges runs the reference scenarios on a
// simulated cluster whose leader changes between every two scenarios, each replica
// with its own client: every scenario passes as on one node.
func TestReferenceScenariosAcrossLeaderChanges(t *testing.T) {
	forEachKind(t, func(t *testing.T, mk func(*testing.T, *testclock.Clock, time.Duration) Projection) {
		e, cl, pods := newClusterEnv(t, mk)
		changes := 0
		referenceScenarios(t, e, pods[0], pods[1], func() {
			cl.ChangeLeader((cl.Leader() + 1) % 3)
			changes++
		})
		if changes < 7 {
			t.Fatalf("%d leader changes", changes)
		}
	})
}

// TestStormAcrossLeaderChange runs the two-replica storm of TestStorm on a simulated
// three-node cluster (docs/celeriant-protocol.md section 6.12), each replica with its
// own client configured with the follower addresses, while the leader changes in the
// middle of each phase: the same request sent 16 times lands exactly once with one
// answer; of 16 distinct requests each lands at most once and every refusal is a 409;
// no request fails with 503. The clients follow 2011 to the leader within the request.
func TestStormAcrossLeaderChange(t *testing.T) {
	forEachKind(t, func(t *testing.T, mk func(*testing.T, *testclock.Clock, time.Duration) Projection) {
		ctx := context.Background()
		e, cl, pods := newClusterEnv(t, mk)
		// changeOnce moves the leadership to the next node before the replicas' k-th
		// write of the phase, while the others are in flight.
		changeOnce := func(k int) {
			var mu sync.Mutex
			seen := 0
			for _, p := range pods {
				p.store.beforeWrite = func(int) {
					mu.Lock()
					defer mu.Unlock()
					if seen++; seen == k {
						cl.ChangeLeader((cl.Leader() + 1) % 3)
					}
				}
			}
		}
		acct := acctID("cluster-storm-" + t.Name())
		const n = 16
		results, errs := make([]Result, n), make([]error, n)
		run := func(f func(i int) (Result, error)) {
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() { defer wg.Done(); results[i], errs[i] = f(i) }()
			}
			wg.Wait()
		}

		changeOnce(1)
		x := eid("cluster-storm", 0)
		run(func(i int) (Result, error) { return pods[i%2].Deposit(ctx, acct, 10, x) })
		for i := range n {
			if errs[i] != nil || results[i] != (Result{10, 1}) {
				t.Errorf("duplicate %d: %+v, %v; want {10, 1}", i, results[i], errs[i])
			}
		}
		if c := e.countID(acct, x); c != 1 {
			t.Fatalf("the duplicated request landed %d times", c)
		}
		if cl.Leader() != 1 {
			t.Fatalf("leader %d: the change did not happen", cl.Leader())
		}

		changeOnce(3)
		run(func(i int) (Result, error) {
			return pods[i%2].Deposit(ctx, acct, int32(i+1), eid("cluster-storm", i+1))
		})
		want := int64(10)
		for i := range n {
			switch c := e.countID(acct, eid("cluster-storm", i+1)); {
			case errs[i] == nil && c == 1:
				want += int64(i + 1)
			case errors.Is(errs[i], ErrConflict) && c == 0:
			default:
				t.Errorf("request %d: err %v (unavailable: %v), in the log %d times", i+1, errs[i], errors.Is(errs[i], ErrUnavailable), c)
			}
		}
		if cl.Leader() != 2 {
			t.Fatalf("leader %d: the second change did not happen", cl.Leader())
		}
		for _, p := range pods {
			if r, err := p.Balance(ctx, acct, 0); err != nil || r.BalanceCents != want {
				t.Errorf("balance %+v, %v; want %d", r, err, want)
			}
		}
		t.Logf("%d of %d distinct requests landed", len(e.events(acct))-1, n)
	})
}

// TestStormAcrossElections: two replicas, each with its own client configured with
// every node, deposit under distinct keys (each to its own account, so that no
// refusal comes from contention), each request sent by both replicas at
// once, while the simulated cluster holds an election of 300 ms every 400 ms (no
// leader: every write is answered 2011 with "{}"). Each client waits out an election
// within the request's budget (5 s here), so no request fails as unavailable (a 503
// over HTTP) and each key lands exactly once.
func TestStormAcrossElections(t *testing.T) {
	if testing.Short() {
		t.Skip("a storm of a few seconds")
	}
	ctx := context.Background()
	mk := func(_ *testing.T, clock *testclock.Clock, window time.Duration) Projection {
		return NewMemoryProjection(WithMemoryClock(clock.Now), WithMemoryWindow(window))
	}
	e, cl, pods := newClusterEnv(t, mk)
	acct := func(k int) uuid.UUID { return acctID(fmt.Sprintf("election-storm-%s-%d", t.Name(), k)) }
	stormCtx, stop := context.WithCancel(ctx)
	changes := make(chan int, 1)
	go func() { changes <- cl.Elections(stormCtx, 100*time.Millisecond, 300*time.Millisecond) }()

	const keys, workers = 600, 16
	var unavailable atomic.Int64
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := int(next.Add(1)); k <= keys; k = int(next.Add(1)) {
				var inner sync.WaitGroup
				for _, p := range pods {
					inner.Add(1)
					go func() {
						defer inner.Done()
						rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
						defer cancel()
						_, err := p.Deposit(rctx, acct(k), 1, eid("election-storm", k))
						switch {
						case errors.Is(err, ErrUnavailable):
							unavailable.Add(1)
						case err != nil:
							t.Errorf("key %d: %v", k, err)
						}
					}()
				}
				inner.Wait()
			}
		}()
	}
	wg.Wait()
	stop()
	n := <-changes
	if n < 3 {
		t.Fatalf("only %d leader changes during the storm", n)
	}
	if u := unavailable.Load(); u != 0 {
		t.Errorf("%d of %d answers unavailable (503) across %d leader changes", u, 2*keys, n)
	}
	for k := 1; k <= keys; k++ {
		if c := e.countID(acct(k), eid("election-storm", k)); c != 1 {
			t.Errorf("key %d landed %d times", k, c)
		}
	}
	t.Logf("%d requests (%d keys, each from both replicas) across %d leader changes with 300 ms elections: %d unavailable",
		2*keys, keys, n, unavailable.Load())
}
