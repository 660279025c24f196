package celeriantsim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/internal/sleep"
)

// clusterState is the role of each node of a Cluster. Guarded by Sim.mu.
type clusterState struct {
	addrs       []string
	leader      int    // index into addrs; -1 while no node leads (an election)
	onNotLeader func() // called after a node answers a write it may not take
}

// Cluster is a small simulated Celeriant cluster (docs/celeriant-protocol.md section
// 6.12): several nodes, each its own TCP address, over one replicated log, one of them
// the leader. A write or trim sent to a follower is answered 2011 (3005 for a trim)
// with the leader's address, or with "{}" while no node leads; reads and
// AggregateDetails are served by every node. The leader changes on demand
// (ChangeLeader). As on the server's leader, a write rejected with 2002, 2003 or
// 2006 waits once for the writes in flight to commit and is checked again, so that a
// rejection never rests on a write that is not yet readable.
//
// What it leaves out: replication lag (every node sees a write once it commits),
// rollbacks (2007) and back-pressure (2012), which Sim.InjectWriteError provides.
type Cluster struct {
	// Sim is the cluster's log, shared by the nodes; its fault injection and Stats
	// apply to every node.
	*Sim
}

// NewCluster starts a cluster of nodes nodes (at least 1) on free loopback ports, node 0
// the leader, with opts for the shared log. Close stops it.
func NewCluster(nodes int, opts Options) (*Cluster, error) {
	if nodes < 1 {
		return nil, errors.New("celeriantsim: a cluster needs at least one node")
	}
	addrs := make([]string, nodes)
	for i := range addrs {
		addrs[i] = "127.0.0.1:0"
	}
	return ListenCluster(addrs, opts)
}

// ListenCluster starts a cluster with one node listening on each of addrs (port 0: a
// free port), node 0 the leader, with opts for the shared log. Close stops it.
func ListenCluster(addrs []string, opts Options) (*Cluster, error) {
	if len(addrs) < 1 {
		return nil, errors.New("celeriantsim: a cluster needs at least one node")
	}
	s := New(opts)
	st := &clusterState{}
	var lns []net.Listener
	for _, addr := range addrs {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range lns {
				_ = l.Close()
			}
			_ = s.Close()
			return nil, fmt.Errorf("celeriantsim: cluster: %w", err)
		}
		lns = append(lns, ln)
		st.addrs = append(st.addrs, ln.Addr().String())
	}
	s.mu.Lock()
	s.cluster = st
	s.mu.Unlock()
	for i, ln := range lns {
		go func() { _ = s.serve(ln, i) }()
	}
	return &Cluster{Sim: s}, nil
}

// Addrs returns the nodes' addresses, in node order.
func (c *Cluster) Addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.cluster.addrs...)
}

// Leader returns the index of the leading node, or -1 while none leads.
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cluster.leader
}

// ChangeLeader makes node to the leader (-1: no leader, as during an election; every
// node then answers writes 2011 with "{}"). Writes already accepted still commit:
// they were replicated.
func (c *Cluster) ChangeLeader(to int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if to < -1 || to >= len(c.cluster.addrs) {
		to = -1
	}
	c.cluster.leader = to
}

// OnNotLeader sets f to be called (without the simulator's lock) each time a node
// answers a write or trim that only the leader may take; nil removes it. Tests use it
// to change the leader while a request is being refused.
func (c *Cluster) OnNotLeader(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cluster.onNotLeader = f
}

// Elections changes the leader on a schedule until ctx ends: every period, no node
// leads for election (every write is answered 2011 with "{}"), then the next node
// leads. It returns the number of leader changes when ctx ends.
func (c *Cluster) Elections(ctx context.Context, period, election time.Duration) int {
	changes := 0
	for {
		if sleep.Ctx(ctx, period) != nil {
			return changes
		}
		next := (c.Leader() + 1) % len(c.Addrs())
		c.ChangeLeader(-1)
		err := sleep.Ctx(ctx, election)
		c.ChangeLeader(next)
		changes++
		if err != nil {
			return changes
		}
	}
}

// notLeader returns the answer of node to a write (trim: 3005), or nil when node may
// take it: a standalone Sim (node < 0) or the cluster's leader.
func (s *Sim) notLeader(node int, trim bool) *celeriant.ServerError {
	s.mu.Lock()
	if s.cluster == nil || node < 0 || node == s.cluster.leader {
		s.mu.Unlock()
		return nil
	}
	code := celeriant.CodeWriteNotLeader
	if trim {
		code = celeriant.CodeTrimNotLeader
	}
	msg := "{}"
	if s.cluster.leader >= 0 {
		msg = jsonMsg("leader_address", s.cluster.addrs[s.cluster.leader])
	}
	hook := s.cluster.onNotLeader
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	return celeriant.NewServerError(code, msg)
}

// visibilityGap reports the rejections a leader checks again after the writes in
// flight have committed.
func visibilityGap(code celeriant.Code) bool {
	return code == celeriant.CodeWriteClientIdempotency || code == celeriant.CodeWriteOCC || code == celeriant.CodeWriteRecreateNotAllowed
}

// awaitInflightLocked waits, with s.mu released, until every write in flight now has
// committed (or ctx ends). Caller holds s.mu; it holds it again on return.
func (s *Sim) awaitInflightLocked(ctx context.Context) {
	var waits []chan struct{}
	for h := range s.active {
		waits = append(waits, h.done)
	}
	s.mu.Unlock()
	defer s.mu.Lock()
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			return
		}
	}
}
