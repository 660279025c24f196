package celeriant_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
)

func newCluster(t *testing.T, nodes int, opts celeriantsim.Options) *celeriantsim.Cluster {
	t.Helper()
	cl, err := celeriantsim.NewCluster(nodes, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// TestClusterLeaderChange: a client configured with a follower's address reaches the
// leader within its first write (2011 names it), follows a leader change within the
// next one, and during an election (no leader: 2011 with "{}") backs off until the
// election ends or its deadline passes; every write landed once.
func TestClusterLeaderChange(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, 3, celeriantsim.Options{})
	addrs := cl.Addrs()
	c := newClient(t, celeriant.Config{Addrs: []string{addrs[1], addrs[2]}})
	key, me := freshKey(), uuid.New()
	if res, err := c.Write(ctx, simpleWrite(key, me, 1)); err != nil || res.Version != 1 || c.Leader() != addrs[0] {
		t.Fatalf("first write via a follower: %+v, %v, leader %s; want version 1 at %s", res, err, c.Leader(), addrs[0])
	}
	cl.ChangeLeader(2)
	if res, err := c.Write(ctx, simpleWrite(key, me, 2)); err != nil || res.Version != 2 || c.Leader() != addrs[2] {
		t.Fatalf("write after the leader change: %+v, %v, leader %s; want version 2 at %s", res, err, c.Leader(), addrs[2])
	}
	// An election: the write waits it out within its own deadline; one that outlasts
	// the deadline ends with the follower's answer, having applied nothing. Its
	// context ends as the second refusal is answered, not after a time the machine's
	// load decides: whether the answer or the cut comes first, the error is 2011.
	cl.ChangeLeader(-1)
	short, cancel := context.WithCancel(ctx)
	defer cancel()
	refusals := 0
	cl.OnNotLeader(func() {
		if refusals++; refusals == 2 {
			cancel()
		}
	})
	_, err := c.Write(short, simpleWrite(key, me, 3))
	if leader, ok := celeriant.IsNotLeader(err); !ok || leader != "" || celeriant.CodeOf(err) != celeriant.CodeWriteNotLeader {
		t.Fatalf("write during an election that outlasts its deadline: %v, want 2011 without a leader", err)
	}
	elected := make(chan struct{})
	cl.OnNotLeader(func() { // the write is waiting out the election: end it
		cl.OnNotLeader(nil)
		cl.ChangeLeader(1)
		close(elected)
	})
	if res, err := c.Write(ctx, simpleWrite(key, me, 3)); err != nil || res.Version != 3 {
		t.Fatalf("write across the election: %+v, %v", res, err)
	}
	<-elected
	if d, err := c.AggregateDetails(ctx, key); err != nil || d.MaxVersion != 3 {
		t.Fatalf("details: %+v, %v", d, err)
	}
	// A trim on a follower is 3005 with the leader, followed the same way.
	raw := trimOverWire(addrs[0])
	wantServerErr := func(err error, code celeriant.Code, msg string) {
		t.Helper()
		var se *celeriant.ServerError
		if !errors.As(err, &se) || se.Code != code || se.Message != msg {
			t.Fatalf("trim on a follower: %v, want %d %s", err, code, msg)
		}
	}
	wantServerErr(raw(ctx, key, 2), celeriant.CodeTrimNotLeader, `{"leader_address":"`+addrs[1]+`"}`)
}

// TestClusterVisibilityRecheck: on a cluster's leader a write rejected by the version
// guard because of a write still in flight waits for that write to commit and is
// checked again (docs/celeriant-protocol.md section 6.12), so when the 2003 comes the
// write that caused it is readable; a standalone node answers at once.
func TestClusterVisibilityRecheck(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, 2, celeriantsim.Options{CommitDelay: celeriantsim.NoCommitDelay})
	c := newClient(t, celeriant.Config{Addrs: cl.Addrs()})
	key := freshKey()
	h := cl.HoldNextWrite()
	first := make(chan error, 1)
	go func() { _, err := c.Write(ctx, simpleWrite(key, uuid.New(), 1)); first <- err }()
	<-h.Prepared()
	second := make(chan error, 1)
	go func() {
		w := simpleWrite(key, uuid.New(), 1)
		w.Writes[0].ExpectedVersion = celeriant.Version(0)
		_, err := c.Write(ctx, w)
		second <- err
	}()
	// The second write is answered only after the first commits: wait until the
	// leader holds it for the recheck, or fail if it answers before.
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for ; cl.Stats().Rechecks == 0; runtime.Gosched() {
		select {
		case err = <-second:
			t.Fatalf("second write answered (%v) while the write that conflicts with it is in flight", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the second write is neither answered nor rechecked")
		}
	}
	h.Commit()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	err = <-second
	if celeriant.CodeOf(err) != celeriant.CodeWriteOCC {
		t.Fatalf("second write: %v, want 2003", err)
	}
	if d, err := c.AggregateDetails(ctx, key); err != nil || d.MaxVersion != 1 {
		t.Fatalf("after the 2003: %+v, %v; want the first write readable", d, err)
	}
}

// TestBusyBackoff: a busy answer (2012, 11000) had no effect, so the client re-sends
// the request after a backoff, up to three times; a fourth busy answer is returned.
func TestBusyBackoff(t *testing.T) {
	ctx := context.Background()
	sim, addr := startSim(t, celeriantsim.Options{})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	key, me := freshKey(), uuid.New()
	sim.InjectWriteError(celeriant.CodeWriteReplicationBackpressure, "{}")
	sim.InjectWriteError(celeriant.CodeServerBusy, "{}")
	if res, err := c.Write(ctx, simpleWrite(key, me, 1)); err != nil || res.Version != 1 {
		t.Fatalf("write after two busy answers: %+v, %v", res, err)
	}
	if n := sim.Stats().Writes; n != 3 {
		t.Fatalf("%d writes reached the simulator, want 3", n)
	}
	for range 4 {
		sim.InjectWriteError(celeriant.CodeWriteReplicationBackpressure, "{}")
	}
	if _, err := c.Write(ctx, simpleWrite(key, me, 2)); celeriant.CodeOf(err) != celeriant.CodeWriteReplicationBackpressure {
		t.Fatalf("write after four busy answers: %v, want 2012", err)
	}
}
