package celeriant_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/internal/testclock"
)

// countingDial counts dials.
type countingDial struct{ n atomic.Int64 }

func (d *countingDial) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.n.Add(1)
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

func simpleWrite(key celeriant.AggregateKey, client uuid.UUID, seq uint64) celeriant.WriteRequest {
	return celeriant.WriteRequest{ClientID: client, Writes: []celeriant.AggregateWrite{{
		Key: key, Events: []celeriant.Event{ev(seq, uuid.New(), "x")}, AllowCreate: true, EnforceClientIdempotency: true,
	}}}
}

func TestLostAnswerIsOutcomeUnknownAndNotResent(t *testing.T) {
	ctx := context.Background()
	sim, addr := startSim(t, celeriantsim.Options{})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	key, client := freshKey(), uuid.New()

	sim.LoseNextWriteAnswer()
	_, err := c.Write(ctx, simpleWrite(key, client, 1))
	if !errors.Is(err, celeriant.ErrOutcomeUnknown) || errors.Is(err, celeriant.ErrNotSent) {
		t.Fatalf("err = %v, want ErrOutcomeUnknown only", err)
	}
	if got := sim.Stats().Writes; got != 1 {
		t.Fatalf("simulator saw %d writes, want 1: the client must not re-send", got)
	}
	// It committed: the held-seq retry with a fresh version gets 2002.
	d, err := c.AggregateDetails(ctx, key)
	if err != nil || d.MaxVersion != 1 || d.LastClientID != client {
		t.Fatalf("details: %+v %v", d, err)
	}
	_, err = c.Write(ctx, simpleWrite(key, client, 1))
	if !celeriant.IsIdempotencyViolation(err) {
		t.Fatalf("held-seq retry: %v", err)
	}
}

// TestInflightHold: a write held in flight gives 2013 to a duplicate, its caller's
// deadline gives ErrOutcomeUnknown, and after commit the duplicate gets 2002.
func TestInflightHoldOverTCP(t *testing.T) {
	sim, addr := startSim(t, celeriantsim.Options{})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	key, client := freshKey(), uuid.New()

	hold := sim.HoldNextWrite()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-hold.Prepared(); cancel() }()
	_, err := c.Write(ctx, simpleWrite(key, client, 1))
	if !errors.Is(err, celeriant.ErrOutcomeUnknown) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while in flight: %v", err)
	}
	bg := context.Background()
	_, err = c.Write(bg, simpleWrite(key, client, 1))
	if !celeriant.IsInflightDuplicate(err) {
		t.Fatalf("duplicate while in flight: %v", err)
	}
	if _, err := c.Read(bg, celeriant.ReadRequest{Key: key}); !celeriant.IsNotFound(err) {
		t.Fatalf("read must not see an uncommitted batch: %v", err)
	}
	hold.Commit()
	// The connection of the abandoned write is gone; the held write commits anyway.
	waitFor(t, func() bool { _, err := c.AggregateDetails(bg, key); return err == nil })
	_, err = c.Write(bg, simpleWrite(key, client, 1))
	if !celeriant.IsIdempotencyViolation(err) {
		t.Fatalf("duplicate after commit: %v", err)
	}
}

// waitFor polls cond (for effects of another goroutine that has no channel to wait on).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestDeadlineExceededAfterSend(t *testing.T) {
	sim, addr := startSim(t, celeriantsim.Options{})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	// One write first, so the held write below finds its connection dialed: under
	// load a dial alone can outlast the deadline, which then ends before anything
	// was sent (ErrNotSent), not after.
	if _, err := c.Write(context.Background(), simpleWrite(freshKey(), uuid.New(), 1)); err != nil {
		t.Fatal(err)
	}
	hold := sim.HoldNextWrite()
	defer hold.Commit()
	// The deadline passes once the server holds the write, not after a fixed time
	// that a loaded machine may spend before the write is even sent.
	ctx := newEventDeadline()
	go func() { <-hold.Prepared(); ctx.expire() }()
	_, err := c.Write(ctx, simpleWrite(freshKey(), uuid.New(), 1))
	if !errors.Is(err, celeriant.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
}

// eventDeadline is a context whose deadline passes when the test says (expire),
// not at a wall-clock time: Deadline reports an hour ahead, Done closes and Err
// becomes context.DeadlineExceeded on expire.
type eventDeadline struct {
	context.Context
	at   time.Time
	done chan struct{}
	once sync.Once
}

func newEventDeadline() *eventDeadline {
	return &eventDeadline{Context: context.Background(), at: time.Now().Add(time.Hour), done: make(chan struct{})}
}

func (c *eventDeadline) expire()                     { c.once.Do(func() { close(c.done) }) }
func (c *eventDeadline) Deadline() (time.Time, bool) { return c.at, true }
func (c *eventDeadline) Done() <-chan struct{}       { return c.done }
func (c *eventDeadline) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func shortCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestNothingSent(t *testing.T) {
	dead := deadAddr(t)
	_, addr := startSim(t, celeriantsim.Options{})

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	closed := newClient(t, celeriant.Config{Addrs: []string{addr}})
	_ = closed.Close()
	sim := celeriantsim.New(celeriantsim.Options{})

	tests := []struct {
		name  string
		store celeriant.EventStore
		ctx   context.Context
		req   celeriant.WriteRequest
		also  error
	}{
		{"connection refused until the deadline", newClient(t, celeriant.Config{Addrs: []string{dead}}), shortCtx(t, 300*time.Millisecond), simpleWrite(freshKey(), uuid.New(), 1), nil},
		{"context done before sending", newClient(t, celeriant.Config{Addrs: []string{addr}}), cancelled, simpleWrite(freshKey(), uuid.New(), 1), context.Canceled},
		{"closed client", closed, context.Background(), simpleWrite(freshKey(), uuid.New(), 1), celeriant.ErrClosed},
		{"nil client id", newClient(t, celeriant.Config{Addrs: []string{addr}}), context.Background(), simpleWrite(freshKey(), uuid.Nil, 1), celeriant.ErrInvalidRequest},
		{"sim: nil client id", sim, context.Background(), simpleWrite(freshKey(), uuid.Nil, 1), celeriant.ErrInvalidRequest},
		{"sim: context done", sim, cancelled, simpleWrite(freshKey(), uuid.New(), 1), context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.store.Write(tt.ctx, tt.req)
			if !errors.Is(err, celeriant.ErrNotSent) || errors.Is(err, celeriant.ErrOutcomeUnknown) {
				t.Fatalf("err = %v, want ErrNotSent only", err)
			}
			if tt.also != nil && !errors.Is(err, tt.also) {
				t.Fatalf("err = %v, want it to wrap %v", err, tt.also)
			}
		})
	}
	if sim.Stats().Writes != 0 {
		t.Fatal("the simulator received a write that was not sent")
	}
	dup := simpleWrite(freshKey(), uuid.New(), 1)
	dup.Writes = append(dup.Writes, dup.Writes[0])
	if _, err := sim.Write(context.Background(), dup); !errors.Is(err, celeriant.ErrInvalidRequest) {
		t.Fatalf("duplicate keys: %v", err)
	}
}

func TestIdleConnectionsDropped(t *testing.T) {
	_, addr := startSim(t, celeriantsim.Options{})
	clock := testclock.New(time.Unix(1_000_000, 0))
	dials := &countingDial{}
	c := newClient(t, celeriant.Config{Addrs: []string{addr}, Now: clock.Now, Dial: dials.Dial})
	ctx, key := context.Background(), freshKey()
	client := uuid.New()
	for i, step := range []struct {
		advance time.Duration
		dials   int64
	}{{0, 1}, {0, 1}, {24 * time.Second, 1}, {25 * time.Second, 2}, {time.Second, 2}} {
		clock.Add(step.advance)
		if _, err := c.Write(ctx, simpleWrite(key, client, uint64(i+1))); err != nil {
			t.Fatal(err)
		}
		if got := dials.n.Load(); got != step.dials {
			t.Fatalf("step %d: %d dials, want %d", i, got, step.dials)
		}
	}
	if _, err := celeriant.New(celeriant.Config{Addrs: []string{addr}, IdleTimeout: 30 * time.Second}); err == nil {
		t.Fatal("an idle timeout of 30 s must be refused")
	}
}

// TestOneRequestPerConnection: with MaxConns 1, a second request waits for the only
// connection (busy with a held write) instead of opening another or pipelining.
func TestOneRequestPerConnection(t *testing.T) {
	sim, addr := startSim(t, celeriantsim.Options{})
	dials := &countingDial{}
	c := newClient(t, celeriant.Config{Addrs: []string{addr}, MaxConns: 1, Dial: dials.Dial})
	key := freshKey()
	hold := sim.HoldNextWrite()
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(context.Background(), simpleWrite(key, uuid.New(), 1))
		done <- err
	}()
	<-hold.Prepared()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Read(ctx, celeriant.ReadRequest{Key: key})
	if !errors.Is(err, celeriant.ErrNotSent) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second request: %v", err)
	}
	hold.Commit()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(context.Background(), celeriant.ReadRequest{Key: key}); err != nil {
		t.Fatal(err)
	}
	if got := dials.n.Load(); got != 1 {
		t.Fatalf("%d dials, want 1", got)
	}
}

func TestConcurrentUse(t *testing.T) {
	sim, addr := startSim(t, celeriantsim.Options{})
	dials := &countingDial{}
	c := newClient(t, celeriant.Config{Addrs: []string{addr}, MaxConns: 3, Dial: dials.Dial})
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for g := 0; g < 20; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key, client := freshKey(), uuid.New()
			for i := uint64(1); i <= 10; i++ {
				if _, err := write1(context.Background(), c, client, key, i-1, ev(i, uuid.New(), "x")); err != nil {
					errs <- err
					return
				}
				res, err := c.Read(context.Background(), celeriant.ReadRequest{Key: key, Filters: celeriant.ReadFilters{FromVersion: i}})
				if err != nil || len(res.Batches) != 1 || res.Batches[0].Events[0].ClientSeq != i {
					errs <- errors.Join(err, errors.New("read mismatch"))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := dials.n.Load(); got > 3 {
		t.Fatalf("%d dials, want at most 3", got)
	}
	if got := sim.Stats().Writes; got != 200 {
		t.Fatalf("%d writes", got)
	}
}

// TestLeaderRouting: a write answered 2011 by a follower goes to the leader it names
// within the same call (the follower refused it before any check, so it had no
// effect), and later requests go there directly; a read does the same.
func TestLeaderRouting(t *testing.T) {
	ctx := context.Background()
	follower, faddr := startSim(t, celeriantsim.Options{})
	leader, laddr := startSim(t, celeriantsim.Options{})
	c := newClient(t, celeriant.Config{Addrs: []string{faddr}})
	key, client := freshKey(), uuid.New()

	follower.InjectWriteError(celeriant.CodeWriteNotLeader, `{"leader_address":"`+laddr+`"}`)
	if res, err := c.Write(ctx, simpleWrite(key, client, 1)); err != nil || res.Version != 1 {
		t.Fatalf("write via the follower: %+v, %v; want it landed at the leader", res, err)
	}
	if c.Leader() != laddr {
		t.Fatalf("Leader() = %s", c.Leader())
	}
	if _, err := c.Write(ctx, simpleWrite(key, client, 2)); err != nil {
		t.Fatal(err)
	}
	if leader.Stats().Writes != 2 || follower.Stats().Writes != 1 {
		t.Fatalf("writes: leader %d follower %d", leader.Stats().Writes, follower.Stats().Writes)
	}
	// A read answered "not leader" follows the redirect once by itself.
	c2 := newClient(t, celeriant.Config{Addrs: []string{faddr}})
	follower.InjectReadError(celeriant.CodeWriteNotLeader, `{"leader_address":"`+laddr+`"}`)
	res, err := c2.Read(ctx, celeriant.ReadRequest{Key: key})
	if err != nil || len(res.Batches) != 2 {
		t.Fatalf("redirected read: %+v %v", res, err)
	}
}

func TestStalePooledConnection(t *testing.T) {
	ctx := context.Background()
	sim, addr := startSim(t, celeriantsim.Options{})
	dials := &countingDial{}
	c := newClient(t, celeriant.Config{Addrs: []string{addr}, Dial: dials.Dial})
	key := freshKey()
	if _, err := c.Write(ctx, simpleWrite(key, uuid.New(), 1)); err != nil {
		t.Fatal(err)
	}
	sim.CloseConnections()
	if _, err := c.Read(ctx, celeriant.ReadRequest{Key: key}); err != nil {
		t.Fatalf("read after the server dropped the pooled connection: %v", err)
	}
	if got := dials.n.Load(); got != 2 {
		t.Fatalf("%d dials, want 2", got)
	}
}

func TestReadAllPaging(t *testing.T) {
	ctx := context.Background()
	_, addr := startSim(t, celeriantsim.Options{PageBatches: 2})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	key, client := freshKey(), uuid.New()
	for i := uint64(1); i <= 5; i++ {
		if _, err := write1(ctx, c, client, key, i-1, ev(i, uuid.New(), "x")); err != nil {
			t.Fatal(err)
		}
	}
	res, err := c.Read(ctx, celeriant.ReadRequest{Key: key})
	if err != nil || len(res.Batches) != 2 || res.NextVersion != 3 {
		t.Fatalf("first page: %+v %v", res, err)
	}
	all, err := celeriant.ReadAll(ctx, c, celeriant.ReadRequest{Key: key})
	if err != nil || len(all) != 5 {
		t.Fatalf("ReadAll: %d batches, %v", len(all), err)
	}
	for i, b := range all {
		if b.Version != uint64(i+1) {
			t.Fatalf("batch %d has version %d", i, b.Version)
		}
	}
}

func TestRequestSizeLimits(t *testing.T) {
	ctx := context.Background()
	sim, addr := startSim(t, celeriantsim.Options{})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}, MaxRequestSize: 1000})
	big := simpleWrite(freshKey(), uuid.New(), 1)
	big.Writes[0].Events[0].Value = make([]byte, 1000)
	if _, err := c.Write(ctx, big); !errors.Is(err, celeriant.ErrNotSent) || !errors.Is(err, celeriant.ErrInvalidRequest) {
		t.Fatalf("oversized write: %v", err)
	}
	manyTypes := celeriant.ReadRequest{Key: freshKey(), Filters: celeriant.ReadFilters{EventTypes: make([]uint64, 1000)}}
	if _, err := c.Read(ctx, manyTypes); !errors.Is(err, celeriant.ErrNotSent) || !errors.Is(err, celeriant.ErrInvalidRequest) {
		t.Fatalf("read over 1007 bytes: %v", err)
	}
	if st := sim.Stats(); st.Writes != 0 || st.Reads != 0 {
		t.Fatalf("the simulator received %+v", st)
	}
	// The connection is still usable.
	if _, err := c.Write(ctx, simpleWrite(freshKey(), uuid.New(), 1)); err != nil {
		t.Fatal(err)
	}
}

func TestSimCloseReleasesHeldWrites(t *testing.T) {
	sim := celeriantsim.New(celeriantsim.Options{})
	ln, err := sim.ListenAndServe("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, celeriant.Config{Addrs: []string{ln.Addr().String()}})
	hold := sim.HoldNextWrite()
	done := make(chan error, 1)
	go func() { _, err := c.Write(context.Background(), simpleWrite(freshKey(), uuid.New(), 1)); done <- err }()
	<-hold.Prepared()
	if err := sim.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !celeriant.IsOutcomeUnknown(err) {
		t.Fatalf("write cut by the server's close: %v", err)
	}
}
