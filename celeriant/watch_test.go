package celeriant_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// The watch vectors of docs/celeriant-protocol.md section 8.3, derived from the
// server's WatchRequest and WatchResponse structs (arrays in declaration order, sets
// as arrays, optional versions as nil).
const (
	vWatchReqBody  = "97 B(66) c0 c0 91 B(11) 91 B(22) 91 B(33) 91 01"
	vWatchResBody  = "91 91 97 B(11) B(22) B(33) 01 05 07 c0"
	vHeartbeatBody = "91 90"
)

func goldenWatchRequest() celeriant.WatchRequest {
	return celeriant.WatchRequest{CorrelationID: idCorr, Orgs: []uuid.UUID{idOrg}, AggregateTypes: []uuid.UUID{idType},
		Aggregates: []uuid.UUID{idAgg}, Operations: []celeriant.WatchOperation{celeriant.WatchWrite}}
}

func TestGoldenWatch(t *testing.T) {
	enc, dec := wire.NewEncoder(), wire.NewDecoder()
	req := goldenWatchRequest()
	res := celeriant.WatchResponse{Events: []celeriant.WatchEvent{{Key: goldenKey, Operation: celeriant.WatchWrite, FromVersion: 5, ToVersion: 7}}}
	for _, tc := range []struct {
		name  string
		frame []byte
		typ   wire.MessageType
		body  string
	}{
		{"WatchRequest", bytes.Clone(enc.WatchRequest(&req)), wire.ReqWatch, vWatchReqBody},
		{"WatchResponse", bytes.Clone(enc.WatchResponse(&res)), wire.RespWatch, vWatchResBody},
		{"Heartbeat", bytes.Clone(enc.WatchResponse(&celeriant.WatchResponse{})), wire.RespWatch, vHeartbeatBody},
	} {
		h, err := wire.ParseHeader(tc.frame)
		if err != nil || h.Type != tc.typ || int(h.UncompressedLength) != len(tc.frame)-wire.HeaderSize {
			t.Fatalf("%s: header %+v, %v", tc.name, h, err)
		}
		if want := hx(t, tc.body); !bytes.Equal(tc.frame[wire.HeaderSize:], want) {
			t.Fatalf("%s:\n got %x\nwant %x", tc.name, tc.frame[wire.HeaderSize:], want)
		}
	}
	gotReq, err := dec.WatchRequest(hx(t, vWatchReqBody))
	if err != nil {
		t.Fatal(err)
	}
	assertEqual(t, gotReq, req)
	gotRes, err := dec.WatchResponse(hx(t, vWatchResBody))
	if err != nil {
		t.Fatal(err)
	}
	assertEqual(t, gotRes, res)
	// The server's request decoder wants exactly 7 elements; an operation is a u8.
	for _, bad := range []string{"96 c0 c0 c0 c0 c0 c0", "97 c0 c0 c0 c0 c0 c0 91 cd 01 00", "97 c0 c0 c0 c0 c0 c0 91 ff"} {
		if _, err := dec.WatchRequest(hx(t, bad)); !errors.Is(err, celeriant.ErrProtocol) {
			t.Errorf("WatchRequest(%s) = %v, want ErrProtocol", bad, err)
		}
	}
}

// watchers runs f against the in-process simulator and against the TCP client in
// front of one: the same Watcher semantics both ways.
func watchers(t *testing.T, opts celeriantsim.Options, f func(t *testing.T, sim *celeriantsim.Sim, w celeriant.Watcher)) {
	t.Run("in-process", func(t *testing.T) {
		sim := celeriantsim.New(opts)
		t.Cleanup(func() { _ = sim.Close() })
		f(t, sim, sim)
	})
	t.Run("tcp", func(t *testing.T) {
		sim, addr := startSim(t, opts)
		f(t, sim, newClient(t, celeriant.Config{Addrs: []string{addr}, Dial: smallReadBuffer}))
	})
}

// smallReadBuffer dials with a 4 KiB socket receive buffer, so a client that stops
// reading holds up the simulator's sender after a few frames, as a slow reader
// holds up the server's.
func smallReadBuffer(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	return c, err
}

func next(t *testing.T, s celeriant.WatchStream) celeriant.WatchResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return res
}

// waitWatchers waits until the simulator holds n subscriptions (a disconnect is
// noticed by the simulator's connection goroutine).
func waitWatchers(t *testing.T, sim *celeriantsim.Sim, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); sim.Watchers() != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d subscriptions, want %d", sim.Watchers(), n)
		}
	}
}

// TestWatchNotifiesCommits: a subscription sees what commits after it was
// acknowledged, never what came before: Create then Write for a new aggregate,
// Write with the version for a later one, nothing for an aggregate or operation its
// filters leave out; Close ends it on the server too.
func TestWatchNotifiesCommits(t *testing.T) {
	watchers(t, celeriantsim.Options{}, func(t *testing.T, sim *celeriantsim.Sim, w celeriant.Watcher) {
		ctx := context.Background()
		key, other, client := freshKey(), freshKey(), uuid.New()
		other.Org, other.Type = key.Org, key.Type
		if _, err := sim.Write(ctx, simpleWrite(key, client, 1)); err != nil { // before the watch: not seen
			t.Fatal(err)
		}
		all, err := w.Watch(ctx, celeriant.WatchRequest{Orgs: []uuid.UUID{key.Org}, Aggregates: []uuid.UUID{key.ID, other.ID}})
		if err != nil {
			t.Fatal(err)
		}
		defer all.Close()
		writes, err := w.Watch(ctx, celeriant.WatchRequest{Aggregates: []uuid.UUID{key.ID}, Operations: []celeriant.WatchOperation{celeriant.WatchWrite}})
		if err != nil {
			t.Fatal(err)
		}
		defer writes.Close()
		waitWatchers(t, sim, 2)

		if _, err := sim.Write(ctx, simpleWrite(key, client, 2)); err != nil {
			t.Fatal(err)
		}
		if _, err := sim.Write(ctx, simpleWrite(other, client, 1)); err != nil {
			t.Fatal(err)
		}
		want := []celeriant.WatchEvent{
			{Key: key, Operation: celeriant.WatchWrite, FromVersion: 2, ToVersion: 2},
			{Key: other, Operation: celeriant.WatchCreate},
			{Key: other, Operation: celeriant.WatchWrite, FromVersion: 1, ToVersion: 1},
		}
		for _, ev := range want {
			assertEqual(t, next(t, all).Events, []celeriant.WatchEvent{ev})
		}
		assertEqual(t, next(t, writes).Events, want[:1])

		_ = writes.Close()
		waitWatchers(t, sim, 1)
		if _, err := writes.Next(ctx); !errors.Is(err, celeriant.ErrClosed) {
			t.Fatalf("Next after Close: %v, want ErrClosed", err)
		}
	})
}

// TestWatchHeartbeat: without notifications the stream yields an empty frame after
// the heartbeat interval.
func TestWatchHeartbeat(t *testing.T) {
	watchers(t, celeriantsim.Options{WatchHeartbeat: 20 * time.Millisecond}, func(t *testing.T, _ *celeriantsim.Sim, w celeriant.Watcher) {
		s, err := w.Watch(context.Background(), celeriant.WatchRequest{Aggregates: []uuid.UUID{uuid.New()}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for range 2 {
			if res := next(t, s); len(res.Events) != 0 {
				t.Fatalf("heartbeat with events %+v", res.Events)
			}
		}
	})
}

// TestWatchLaggingSubscriberIsDropped: a subscriber that lets WatchQueue
// notifications pile up is dropped by the server; it still receives what was
// queued, then its stream ends with ErrTransport. Writers are never held up.
func TestWatchLaggingSubscriberIsDropped(t *testing.T) {
	// NoCommitDelay: the writes must come faster than the sender drains the queue,
	// which a commit window per write would not allow.
	watchers(t, celeriantsim.Options{WatchQueue: 3, CommitDelay: celeriantsim.NoCommitDelay}, func(t *testing.T, sim *celeriantsim.Sim, w celeriant.Watcher) {
		ctx := context.Background()
		key, client := freshKey(), uuid.New()
		s, err := w.Watch(ctx, celeriant.WatchRequest{Aggregates: []uuid.UUID{key.ID}, Operations: []celeriant.WatchOperation{celeriant.WatchWrite}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		waitWatchers(t, sim, 1)
		// Over TCP the simulator's sender takes one notification off the queue as
		// soon as it arrives, and the socket buffers hold more: hold the sender by
		// writing past what the queue and the buffers can absorb, as a reader that
		// stopped reading would.
		n := 3
		if _, ok := w.(*celeriant.Client); ok {
			n = 5000
		}
		for i := range n + 1 {
			if _, err := sim.Write(ctx, simpleWrite(key, client, uint64(i+1))); err != nil {
				t.Fatal(err)
			}
		}
		waitWatchers(t, sim, 0)
		var got uint64
		for {
			res, err := s.Next(ctx)
			if err != nil {
				if !errors.Is(err, celeriant.ErrTransport) {
					t.Fatalf("end of a dropped stream: %v, want ErrTransport", err)
				}
				break
			}
			for _, ev := range res.Events {
				if ev.FromVersion != got+1 {
					t.Fatalf("version %d after %d: the queued notifications arrive in order", ev.FromVersion, got)
				}
				got = ev.ToVersion
			}
		}
		if got < 3 || got > uint64(n) {
			t.Fatalf("received up to version %d of %d writes, want the queued ones and not all", got, n+1)
		}
		t.Logf("dropped after delivering versions 1..%d of %d", got, n+1)
	})
}

// TestWatchLatencyMerges: with a requested latency, the acknowledgement opens
// the first window (a write right after it waits for the window's end), and
// notifications of one window come in one frame, merged per aggregate and
// operation (a version range). The window is 1 s: the three writes after the
// first frame must land within it on a loaded machine, and the first frame must
// come no sooner than half of it.
func TestWatchLatencyMerges(t *testing.T) {
	watchers(t, celeriantsim.Options{}, func(t *testing.T, sim *celeriantsim.Sim, w celeriant.Watcher) {
		ctx := context.Background()
		key, client := freshKey(), uuid.New()
		s, err := w.Watch(ctx, celeriant.WatchRequest{Aggregates: []uuid.UUID{key.ID}, RequestedLatencyMs: celeriant.Version(1000),
			Operations: []celeriant.WatchOperation{celeriant.WatchWrite}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		waitWatchers(t, sim, 1)
		subscribed := time.Now() // after the acknowledgement
		if _, err := sim.Write(ctx, simpleWrite(key, client, 1)); err != nil {
			t.Fatal(err)
		}
		// The acknowledgement opened a window: the first write waits for its end. The
		// first notification after a quiet window goes out at once; the writes within
		// the next window are merged into one.
		assertEqual(t, next(t, s).Events, []celeriant.WatchEvent{{Key: key, Operation: celeriant.WatchWrite, FromVersion: 1, ToVersion: 1}})
		if waited := time.Since(subscribed); waited < 500*time.Millisecond {
			t.Fatalf("the first notification came %v after subscribing, want the end of the 1 s window the acknowledgement opened", waited)
		}
		for seq := uint64(2); seq <= 4; seq++ {
			if _, err := sim.Write(ctx, simpleWrite(key, client, seq)); err != nil {
				t.Fatal(err)
			}
		}
		assertEqual(t, next(t, s).Events, []celeriant.WatchEvent{{Key: key, Operation: celeriant.WatchWrite, FromVersion: 2, ToVersion: 4}})
	})
}

// TestWatchRefused: the server's refusals, each a *ServerError.
func TestWatchRefused(t *testing.T) {
	watchers(t, celeriantsim.Options{MaxWatchers: 1}, func(t *testing.T, _ *celeriantsim.Sim, w celeriant.Watcher) {
		ctx := context.Background()
		for _, tc := range []struct {
			name string
			req  celeriant.WatchRequest
			code celeriant.Code
		}{
			{"latency over the maximum", celeriant.WatchRequest{Aggregates: []uuid.UUID{uuid.New()}, RequestedLatencyMs: celeriant.Version(2001)}, celeriant.CodeWatchLatencyTooHigh},
			{"shard id out of range", celeriant.WatchRequest{ShardID: celeriant.Version(1)}, celeriant.CodeShardRoutingIncompatible},
		} {
			if _, err := w.Watch(ctx, tc.req); !errors.Is(err, tc.code) {
				t.Errorf("%s: %v, want %d", tc.name, err, tc.code)
			}
		}
		s, err := w.Watch(ctx, celeriant.WatchRequest{ShardID: celeriant.Version(0)})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := w.Watch(ctx, celeriant.WatchRequest{ShardID: celeriant.Version(0)}); !errors.Is(err, celeriant.CodeWatchTooManySubscribers) {
			t.Errorf("second subscriber over MaxWatchers 1: %v, want 8005", err)
		}
	})
}

// TestWatchRouting: without aggregates (or across shards) the server refuses with
// 9002 (9001) and its shard count; the in-process simulator returns that, and the
// client opens one subscription per shard and merges them, as the server's own
// client does.
func TestWatchRouting(t *testing.T) {
	ctx := context.Background()
	sim, addr := startSim(t, celeriantsim.Options{Shards: 2})
	org := uuid.New()
	if _, err := sim.Watch(ctx, celeriant.WatchRequest{Orgs: []uuid.UUID{org}}); !errors.Is(err, celeriant.CodeShardRoutingIncompatible) {
		t.Fatalf("in-process watch without aggregates: %v, want 9002", err)
	}
	var onShard [2]celeriant.AggregateKey
	for found := 0; found < 2; {
		k := celeriant.AggregateKey{Org: org, Type: uuid.New(), ID: uuid.New()}
		if sh := k.ID[15] % 2; onShard[sh].ID == uuid.Nil { // id mod 2 is the last byte's parity
			onShard[sh] = k
			found++
		}
	}
	var se *celeriant.ServerError
	if _, err := sim.Watch(ctx, celeriant.WatchRequest{Aggregates: []uuid.UUID{onShard[0].ID, onShard[1].ID}}); !errors.As(err, &se) ||
		se.Code != celeriant.CodeShardRoutingMultipleShards || se.NumShards != 2 {
		t.Fatalf("in-process watch across shards: %v, want 9001 with num_shards 2", err)
	}
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	s, err := c.Watch(ctx, celeriant.WatchRequest{Orgs: []uuid.UUID{org}, Operations: []celeriant.WatchOperation{celeriant.WatchWrite}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	waitWatchers(t, sim, 2)
	client := uuid.New()
	seen := map[celeriant.AggregateKey]bool{}
	for _, k := range onShard {
		if _, err := sim.Write(ctx, simpleWrite(k, client, 1)); err != nil {
			t.Fatal(err)
		}
		for _, ev := range next(t, s).Events {
			seen[ev.Key] = true
		}
	}
	if !seen[onShard[0]] || !seen[onShard[1]] {
		t.Fatalf("notifications of %v, want both shards' aggregates", seen)
	}
	_ = s.Close()
	waitWatchers(t, sim, 0)
}

// TestWatchServerGone: the stream of a simulator that drops its connections ends
// with ErrTransport.
func TestWatchServerGone(t *testing.T) {
	sim, addr := startSim(t, celeriantsim.Options{})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	s, err := c.Watch(context.Background(), celeriant.WatchRequest{Aggregates: []uuid.UUID{uuid.New()}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sim.CloseConnections()
	if _, err := s.Next(context.Background()); !errors.Is(err, celeriant.ErrTransport) {
		t.Fatalf("Next after the server closed the connection: %v, want ErrTransport", err)
	}
}
