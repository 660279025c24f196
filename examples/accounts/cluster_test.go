package accounts

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

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
