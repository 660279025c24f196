package celeriant_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// waitingForConnection reports whether some goroutine is blocked in Client.attempt's
// wait for a free connection (there is no channel to observe that from outside).
func waitingForConnection() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "[select") && strings.Contains(g, "celeriant.(*Client).attempt") {
			return true
		}
	}
	return false
}

// TestCloseWhileWaitingForConnection: a request waiting for a connection when Close runs
// fails with ErrClosed (nothing sent) instead of dialling a new connection after Close.
func TestCloseWhileWaitingForConnection(t *testing.T) {
	sim, addr := startSim(t, celeriantsim.Options{})
	dials := &countingDial{}
	c := newClient(t, celeriant.Config{Addrs: []string{addr}, MaxConns: 1, Dial: dials.Dial})
	hold := sim.HoldNextWrite()
	first := make(chan error, 1)
	go func() { _, err := c.Write(context.Background(), simpleWrite(freshKey(), uuid.New(), 1)); first <- err }()
	<-hold.Prepared()
	second := make(chan error, 1)
	go func() { _, err := c.Read(context.Background(), celeriant.ReadRequest{Key: freshKey()}); second <- err }()
	waitFor(t, waitingForConnection)
	_ = c.Close()
	hold.Commit()
	if err := <-first; err != nil {
		t.Fatalf("in-flight write: %v", err)
	}
	if err := <-second; !errors.Is(err, celeriant.ErrClosed) || !errors.Is(err, celeriant.ErrNotSent) {
		t.Fatalf("request waiting when Close ran: %v", err)
	}
	if n := dials.n.Load(); n != 1 {
		t.Fatalf("%d dials, want 1: nothing may dial after Close", n)
	}
}

// lateCancelConn cancels the request's context as the last byte of the answer is read,
// and holds the client's resulting "deadline in the past" call until the next request on
// the same connection has set its own deadline: the late context callback then lands on
// that next request.
type lateCancelConn struct {
	net.Conn
	cancel    context.CancelFunc
	answer    int // bytes of the first answer
	read      atomic.Int64
	mu        sync.Mutex
	cancelled bool
	pastCall  chan struct{} // closed when the client's past-deadline call is waiting
	release   chan struct{} // closed to let it proceed
	done      chan struct{} // closed when it has proceeded
}

func (c *lateCancelConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.read.Add(int64(n)) == int64(c.answer) && c.cancel != nil {
		c.mu.Lock()
		c.cancelled = true
		c.mu.Unlock()
		c.cancel()
		<-c.pastCall // the context callback has started
	}
	return n, err
}

func (c *lateCancelConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	cancelled := c.cancelled
	c.mu.Unlock()
	switch {
	case cancelled && t.Before(time.Unix(2, 0)) && t.After(time.Unix(0, 0)): // the callback
		close(c.pastCall)
		<-c.release
		defer close(c.done)
	case cancelled && t.After(time.Now()): // the next request on this connection
		if err := c.Conn.SetDeadline(t); err != nil {
			return err
		}
		close(c.release)
		<-c.done
		return nil
	}
	return c.Conn.SetDeadline(t)
}

// TestLateContextCallbackDoesNotPoisonPool: when the context ends just as the answer
// arrives, the client's deadline callback may run after the connection went back to the
// pool; the connection must then be dropped, not handed to the next request with a
// deadline in the past.
func TestLateContextCallbackDoesNotPoisonPool(t *testing.T) {
	_, addr := startSim(t, celeriantsim.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		first *lateCancelConn
		dials atomic.Int64
	)
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, a)
		if err != nil || dials.Add(1) > 1 {
			return nc, err
		}
		first = &lateCancelConn{Conn: nc, cancel: cancel, answer: wire.HeaderSize + 20,
			pastCall: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
		return first, nil
	}
	c := newClient(t, celeriant.Config{Addrs: []string{addr}, Dial: dial})
	key, client := freshKey(), uuid.New()
	if _, err := c.Write(ctx, simpleWrite(key, client, 1)); err != nil {
		t.Fatalf("first write (answered before the cancel took effect): %v", err)
	}
	t.Cleanup(func() {
		select {
		case <-first.release:
		default:
			close(first.release) // unblock the callback when the connection was dropped
		}
	})
	if _, err := c.Write(context.Background(), simpleWrite(key, client, 2)); err != nil {
		t.Fatalf("second write: %v", err)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d dials, want 2 (the first connection dropped)", n)
	}
}

// partialConn sends only the first half of the first frame, then fails.
type partialConn struct{ net.Conn }

func (c partialConn) Write(b []byte) (int, error) {
	n, _ := c.Conn.Write(b[:len(b)/2])
	return n, errors.New("simulated failure mid-frame")
}

// TestPartialWriteNotSent: a frame cut short never reaches the server as a request (it
// waits for the rest, then closes at its idle timeout), so the write is ErrNotSent, and
// the server indeed saw no write.
func TestPartialWriteNotSent(t *testing.T) {
	sim, addr := startSim(t, celeriantsim.Options{})
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, a)
		if err != nil {
			return nil, err
		}
		return partialConn{nc}, nil
	}
	c := newClient(t, celeriant.Config{Addrs: []string{addr}, Dial: dial})
	_, err := c.Write(context.Background(), simpleWrite(freshKey(), uuid.New(), 1))
	if !errors.Is(err, celeriant.ErrNotSent) || errors.Is(err, celeriant.ErrOutcomeUnknown) {
		t.Fatalf("err = %v", err)
	}
	if n := sim.Stats().Writes; n != 0 {
		t.Fatalf("the simulator processed %d writes", n)
	}
}

// TestLeaderFailover: when the leader a not-leader answer names cannot be dialled, the
// request is not lost (the follower applied nothing): the client goes back to the
// configured addresses within the same request, where the node it reaches takes the
// write or names the new leader. A configured address that cannot be dialled moves the
// same request on to the next one.
func TestLeaderFailover(t *testing.T) {
	ctx := context.Background()
	dead := deadAddr(t)
	follower, faddr := startSim(t, celeriantsim.Options{})
	leader, laddr := startSim(t, celeriantsim.Options{})
	c := newClient(t, celeriant.Config{Addrs: []string{faddr, laddr}})
	key, client := freshKey(), uuid.New()

	follower.InjectWriteError(celeriant.CodeWriteNotLeader, `{"leader_address":"`+dead+`"}`)
	if _, err := c.Write(ctx, simpleWrite(key, client, 1)); err != nil {
		t.Fatalf("write via the follower to the dead leader: %v", err)
	}
	if got := c.Leader(); got != faddr {
		t.Fatalf("after the dead leader: target %s, want the first address %s", got, faddr)
	}
	follower.InjectWriteError(celeriant.CodeWriteNotLeader, `{"leader_address":"`+laddr+`"}`)
	if _, err := c.Write(ctx, simpleWrite(freshKey(), client, 1)); err != nil {
		t.Fatalf("write via the follower to the new leader: %v", err)
	}
	// follower: the two refusals and the write it took after the dead leader.
	if leader.Stats().Writes != 1 || follower.Stats().Writes != 3 {
		t.Fatalf("writes: leader %d, follower %d", leader.Stats().Writes, follower.Stats().Writes)
	}
	c2 := newClient(t, celeriant.Config{Addrs: []string{dead, laddr}})
	if _, err := c2.Write(ctx, simpleWrite(freshKey(), uuid.New(), 1)); err != nil || c2.Leader() != laddr {
		t.Fatalf("write with a dead first address: %v, target %s; want it at %s", err, c2.Leader(), laddr)
	}
	// With every address dead the request ends at its deadline, never sent.
	c3 := newClient(t, celeriant.Config{Addrs: []string{dead}})
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := c3.Write(dctx, simpleWrite(freshKey(), uuid.New(), 1)); !errors.Is(err, celeriant.ErrNotSent) {
		t.Fatalf("write with no address alive: %v, want ErrNotSent", err)
	}
}

func isNotLeader(err error) bool { _, ok := celeriant.IsNotLeader(err); return ok }
