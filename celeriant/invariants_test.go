package celeriant_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// startSim serves a fresh simulator on a free loopback port and returns it with its address.
func startSim(t testing.TB, opts celeriantsim.Options) (*celeriantsim.Sim, string) {
	t.Helper()
	sim := celeriantsim.New(opts)
	ln, err := sim.ListenAndServe("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	return sim, ln.Addr().String()
}

func newClient(t testing.TB, cfg celeriant.Config) *celeriant.Client {
	t.Helper()
	c, err := celeriant.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// deadAddr returns a loopback address that was free a moment ago and has no listener:
// dialling it is refused.
func deadAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// serveConns listens on a free loopback port until the test ends, runs handle on its own
// goroutine for every connection accepted, and returns the address.
func serveConns(t testing.TB, handle func(nc net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(nc)
		}
	}()
	return ln.Addr().String()
}

// stores returns the EventStores the invariant suite runs against: the simulator
// in-process, the real client over TCP to the simulator, and a real server when
// CELERIANT_ADDR is set.
func stores(t *testing.T) map[string]celeriant.EventStore {
	_, addr := startSim(t, celeriantsim.Options{})
	return map[string]celeriant.EventStore{
		"sim-inprocess":  celeriantsim.New(celeriantsim.Options{}),
		"client-tcp-sim": newClient(t, celeriant.Config{Addrs: []string{addr}}),
	}
}

// freshKey returns a never-used aggregate key, so the suite can rerun against a
// persistent real server.
func freshKey() celeriant.AggregateKey {
	return celeriant.AggregateKey{Org: uuid.New(), Type: uuid.New(), ID: uuid.New()}
}

func ev(seq uint64, eventID uuid.UUID, payload string) celeriant.Event {
	return celeriant.Event{ClientSeq: seq, EventID: eventID, Timestamp: uint64(time.Now().UnixMilli()), TypeMajor: 1, Value: []byte(payload)}
}

func write1(ctx context.Context, s celeriant.EventStore, client uuid.UUID, key celeriant.AggregateKey, expected uint64, e celeriant.Event) (celeriant.WriteResult, error) {
	return s.Write(ctx, celeriant.WriteRequest{ClientID: client, Writes: []celeriant.AggregateWrite{{
		Key: key, Events: []celeriant.Event{e}, AllowCreate: true,
		ExpectedVersion: celeriant.Version(expected), EnforceClientIdempotency: true,
	}}})
}

type owner int

const (
	ownerOurs owner = iota
	ownerSibling
	ownerUnwritten
)

// whoOwnsSeq is the point read of docs/account-service.md section 3.4.
func whoOwnsSeq(ctx context.Context, s celeriant.EventStore, client uuid.UUID, key celeriant.AggregateKey, seq uint64, eventID uuid.UUID) (owner, error) {
	res, err := s.Read(ctx, celeriant.ReadRequest{Key: key, Filters: celeriant.ReadFilters{
		FromVersion: 1, MinClientSeq: celeriant.Uint64(seq), MaxClientSeq: celeriant.Uint64(seq), IncludeClientID: client,
	}})
	if celeriant.IsNotFound(err) {
		return ownerUnwritten, nil
	}
	if err != nil {
		return 0, err
	}
	for _, b := range res.Batches {
		for _, e := range b.Events {
			if e.ClientSeq == seq {
				if e.EventID == eventID {
					return ownerOurs, nil
				}
				return ownerSibling, nil
			}
		}
	}
	return ownerUnwritten, nil
}

func countEvents(ctx context.Context, t *testing.T, s celeriant.EventStore, key celeriant.AggregateKey) (int, map[string]int) {
	t.Helper()
	batches, err := celeriant.ReadAll(ctx, s, celeriant.ReadRequest{Key: key, Filters: celeriant.ReadFilters{FromVersion: 1}})
	if err != nil {
		t.Fatal(err)
	}
	n, payloads := 0, map[string]int{}
	for _, b := range batches {
		for _, e := range b.Events {
			n++
			payloads[string(e.Value)]++
		}
	}
	return n, payloads
}

func mustCode(t *testing.T, err error, code celeriant.Code) {
	t.Helper()
	if celeriant.CodeOf(err) != code {
		t.Fatalf("err = %v, want code %d", err, code)
	}
}

// runInvariants runs docs/account-service.md section 5.3 against s.
func runInvariants(t *testing.T, s celeriant.EventStore) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("occ_before_idempotency", func(t *testing.T) {
		key, client, other := freshKey(), uuid.New(), uuid.New()
		for i, e := range []struct {
			client uuid.UUID
			seq    uint64
		}{{client, 1}, {client, 2}, {other, 1}} {
			if _, err := write1(ctx, s, e.client, key, uint64(i), ev(e.seq, uuid.New(), "setup")); err != nil {
				t.Fatalf("setup write %d: %v", i, err)
			}
		}
		// Stale expected version and a duplicate seq: the version guard answers first.
		_, err := write1(ctx, s, client, key, 1, ev(1, uuid.New(), "dup"))
		mustCode(t, err, celeriant.CodeWriteOCC)
		var se *celeriant.ServerError
		if !errors.As(err, &se) || se.ExpectedVersion != 1 || se.CurrentVersion != 3 {
			t.Fatalf("2003 detail: %+v", se)
		}
		// Fresh version, duplicate seq: idempotency.
		_, err = write1(ctx, s, client, key, 3, ev(1, uuid.New(), "dup"))
		mustCode(t, err, celeriant.CodeWriteClientIdempotency)
		if !errors.As(err, &se) || se.LastClientSeq != 2 || se.AttemptedClientSeq != 1 {
			t.Fatalf("2002 detail: %+v", se)
		}
		res, err := write1(ctx, s, client, key, 3, ev(3, uuid.New(), "fresh"))
		if err != nil || res.Version != 4 {
			t.Fatalf("fresh seq: %+v %v", res, err)
		}
		if n, _ := countEvents(ctx, t, s, key); n != 4 {
			t.Fatalf("events = %d, want 4", n)
		}
	})

	t.Run("held_seq_sibling_recovery", func(t *testing.T) {
		key, client := freshKey(), uuid.New()
		if _, err := write1(ctx, s, client, key, 0, ev(1, uuid.New(), "setup")); err != nil {
			t.Fatal(err)
		}
		eidA, eidB, eidC := uuid.New(), uuid.New(), uuid.New()
		if _, err := write1(ctx, s, client, key, 1, ev(2, eidA, "A")); err != nil {
			t.Fatalf("A: %v", err)
		}
		// B holds seq 2 with a fresh version: 2002, owned by a sibling, so B re-derives.
		_, err := write1(ctx, s, client, key, 2, ev(2, eidB, "B"))
		mustCode(t, err, celeriant.CodeWriteClientIdempotency)
		if o, err := whoOwnsSeq(ctx, s, client, key, 2, eidB); err != nil || o != ownerSibling {
			t.Fatalf("owner of seq 2 for B = %v, %v; want sibling", o, err)
		}
		if _, err := write1(ctx, s, client, key, 2, ev(3, eidB, "B")); err != nil {
			t.Fatalf("B re-derived: %v", err)
		}
		// C lands, its ack is "lost", its retry with a fresh version gets 2002 owned by C.
		if _, err := write1(ctx, s, client, key, 3, ev(4, eidC, "C")); err != nil {
			t.Fatalf("C: %v", err)
		}
		_, err = write1(ctx, s, client, key, 4, ev(4, eidC, "C"))
		mustCode(t, err, celeriant.CodeWriteClientIdempotency)
		if o, err := whoOwnsSeq(ctx, s, client, key, 4, eidC); err != nil || o != ownerOurs {
			t.Fatalf("owner of seq 4 for C = %v, %v; want ours", o, err)
		}
		n, payloads := countEvents(ctx, t, s, key)
		if n != 4 || payloads["A"] != 1 || payloads["B"] != 1 || payloads["C"] != 1 {
			t.Fatalf("events = %d %v", n, payloads)
		}
		if o, err := whoOwnsSeq(ctx, s, client, key, 9, eidC); err != nil || o != ownerUnwritten {
			t.Fatalf("owner of seq 9 = %v, %v; want unwritten", o, err)
		}
	})
}

func TestInvariants(t *testing.T) {
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) { runInvariants(t, s) })
	}
}

// TestLiveServer runs the invariant suite and the rules suite against a real Celeriant
// server (CELERIANT_ADDR=host:port, protocol v3, no Identify, one shard). It is skipped
// otherwise, also in CI, where no server runs (docs/celeriant-protocol.md section 7).
// CELERIANT_MAX_RESPONSE_SIZE names the server's --max-response-size when it is not
// the default 64 MiB; the paging rule runs only for a budget of 4 MiB or less.
func TestLiveServer(t *testing.T) {
	addr := os.Getenv("CELERIANT_ADDR")
	if addr == "" {
		t.Skip("CELERIANT_ADDR not set: skipping the suite against a real Celeriant server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := celeriant.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	runInvariants(t, c)
	pageBytes := celeriant.DefaultMaxResponseSize
	if v := os.Getenv("CELERIANT_MAX_RESPONSE_SIZE"); v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			t.Fatalf("CELERIANT_MAX_RESPONSE_SIZE=%q: %v", v, err)
		}
		pageBytes = int(n)
	}
	t.Run("rules", func(t *testing.T) {
		runServerRules(t, ruleTarget{s: c, watch: c, trim: trimOverWire(addr), pageBytes: pageBytes})
	})
	t.Run("malformed", func(t *testing.T) { closesOnMalformed(t, addr, celeriant.DefaultMaxRequestSize, false) })
	t.Run("raw_read_from_zero", func(t *testing.T) {
		key, client := freshKey(), uuid.New()
		if _, err := write1(ctx, c, client, key, 0, ev(1, uuid.New(), "x")); err != nil {
			t.Fatal(err)
		}
		se := rawRead(t, addr, celeriant.ReadRequest{CorrelationID: uuid.New(), Key: key})
		if se == nil || se.Code != celeriant.CodeReadUnavailableVersion || se.Message != `{"requested":0,"minimum_available":1}` {
			t.Fatalf("read from version 0: %v, want 1000", se)
		}
	})
	t.Run("watch_heartbeat", func(t *testing.T) {
		// A quiet subscription gets an empty frame within the heartbeat interval.
		st, err := c.Watch(ctx, celeriant.WatchRequest{Aggregates: []uuid.UUID{freshKey().ID}})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		start := time.Now()
		res, err := st.Next(ctx)
		if waited := time.Since(start); err != nil || len(res.Events) != 0 || waited > celeriant.WatchHeartbeat+time.Second {
			t.Fatalf("after %v: %+v, %v; want a heartbeat within %v", waited, res, err, celeriant.WatchHeartbeat)
		}
	})
	t.Run("details_and_not_found", func(t *testing.T) {
		_, err := c.AggregateDetails(ctx, freshKey())
		if !celeriant.IsNotFound(err) {
			t.Fatalf("details of a fresh key: %v", err)
		}
		_, err = c.Read(ctx, celeriant.ReadRequest{Key: freshKey(), Filters: celeriant.ReadFilters{FromVersion: 1}})
		if !celeriant.IsNotFound(err) {
			t.Fatalf("read of a fresh key: %v", err)
		}
	})
}

// rawRead sends req as it is (FromVersion 0 included, which the client would send as 1)
// and returns the server's error answer, or nil for a ReadResponse.
func rawRead(t *testing.T, addr string, req celeriant.ReadRequest) *celeriant.ServerError {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write(wire.NewEncoder().ReadRequest(&req)); err != nil {
		t.Fatal(err)
	}
	h, body, err := wire.ReadFrame(nc, nil, func(h wire.Header) error { return h.CheckResponse(celeriant.DefaultMaxResponseSize) })
	if err != nil {
		t.Fatal(err)
	}
	if h.Type != wire.RespError {
		return nil
	}
	ef, err := wire.NewDecoder().ErrorResponse(body)
	if err != nil {
		t.Fatal(err)
	}
	se := celeriant.NewServerError(celeriant.Code(ef.Code), ef.Message)
	se.CorrelationID = ef.CorrelationID
	if se.CorrelationID != req.CorrelationID {
		t.Fatalf("correlation id %s, want %s", se.CorrelationID, req.CorrelationID)
	}
	return se
}
