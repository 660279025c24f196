package celeriantsim_test

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

// TestWriteRules pins the rules of docs/celeriant-protocol.md sections 6.1-6.4 that the other tests do
// not: each case is a sequence of writes (by client A unless noted) and the code each
// must get (0 = success), then the aggregates' versions.
func TestWriteRules(t *testing.T) {
	type step struct {
		client string // "A" (default) or "B"
		ws     []celeriant.AggregateWrite
		want   celeriant.Code
	}
	// Keys p and q are fresh per case; x(...) builds an entry for them.
	type keys struct{ p, q celeriant.AggregateKey }
	v := celeriant.Version
	noCreate := func(w celeriant.AggregateWrite) celeriant.AggregateWrite { w.AllowCreate = false; return w }
	tests := []struct {
		name  string
		steps func(k keys) []step
		// versions of p and q afterwards (0: does not exist)
		p, q uint64
	}{
		{"version guard before idempotency (docs/account-service.md 5.3)", func(k keys) []step {
			return []step{
				{ws: ws(aw(k.p, nil, true, evt(1)))}, {ws: ws(aw(k.p, nil, true, evt(2)))}, {client: "B", ws: ws(aw(k.p, nil, true, evt(1)))},
				{ws: ws(aw(k.p, v(1), true, evt(1))), want: celeriant.CodeWriteOCC},
				{ws: ws(aw(k.p, v(3), true, evt(1))), want: celeriant.CodeWriteClientIdempotency},
				{ws: ws(aw(k.p, v(3), true, evt(3)))},
			}
		}, 4, 0},
		{"only the lowest seq of a write is compared", func(k keys) []step {
			return []step{
				{ws: ws(aw(k.p, nil, true, evt(5)))},
				{ws: ws(aw(k.p, nil, true, evt(7), evt(3))), want: celeriant.CodeWriteClientIdempotency},
				{ws: ws(aw(k.p, nil, true, evt(6), evt(6)))}, // no uniqueness check within a write
			}
		}, 2, 0},
		{"client seq 0 sets no floor", func(k keys) []step {
			return []step{{ws: ws(aw(k.p, nil, true, evt(0)))}, {ws: ws(aw(k.p, nil, true, evt(0)))}}
		}, 2, 0},
		{"a rejected write does not raise the floor", func(k keys) []step {
			return []step{
				{ws: ws(aw(k.p, nil, true, evt(1)))},
				{ws: ws(aw(k.p, v(0), true, evt(9))), want: celeriant.CodeWriteOCC},
				{ws: ws(aw(k.p, v(1), true, evt(2)))},
			}
		}, 2, 0},
		{"a write without enforcement is not checked but raises the floor", func(k keys) []step {
			return []step{
				{ws: ws(aw(k.p, nil, true, evt(4)))},
				{ws: ws(aw(k.p, nil, false, evt(1)))},
				{ws: ws(aw(k.p, nil, false, evt(8)))},
				{ws: ws(aw(k.p, nil, true, evt(8))), want: celeriant.CodeWriteClientIdempotency},
			}
		}, 3, 0},
		{"allowCreate: missing gives 2005 even with expected 0 or nil; existing needs none", func(k keys) []step {
			return []step{
				{ws: ws(noCreate(aw(k.p, nil, true, evt(1)))), want: celeriant.CodeWriteAggregateNotExists},
				{ws: ws(noCreate(aw(k.p, v(0), true, evt(1)))), want: celeriant.CodeWriteAggregateNotExists},
				{ws: ws(aw(k.p, v(0), true, evt(1)))},
				{ws: ws(noCreate(aw(k.p, v(1), true, evt(2))))},
			}
		}, 2, 0},
		{"multi: 2005 on one entry creates neither", func(k keys) []step {
			return []step{{ws: ws(aw(k.p, v(0), true, evt(1)), noCreate(aw(k.q, nil, true, evt(1)))), want: celeriant.CodeWriteAggregateNotExists}}
		}, 0, 0},
		{"multi: 2002 on one entry applies neither and raises no floor", func(k keys) []step {
			return []step{
				{ws: ws(aw(k.q, nil, true, evt(3)))},
				{ws: ws(aw(k.p, nil, true, evt(9)), aw(k.q, nil, true, evt(3))), want: celeriant.CodeWriteClientIdempotency},
				{ws: ws(aw(k.p, v(0), true, evt(1)))},
			}
		}, 1, 1},
		{"multi: version guard before idempotency on the same entry", func(k keys) []step {
			return []step{
				{ws: ws(aw(k.p, nil, true, evt(1)), aw(k.q, nil, true, evt(1)))},
				{ws: ws(aw(k.p, v(1), true, evt(2)), aw(k.q, v(0), true, evt(1))), want: celeriant.CodeWriteOCC},
			}
		}, 1, 1},
		{"multi: each aggregate has its own floor and its own +1 version", func(k keys) []step {
			return []step{
				{ws: ws(aw(k.p, nil, true, evt(5), evt(6)), aw(k.q, nil, true, evt(1)))},
				{ws: ws(aw(k.p, v(1), true, evt(7)), aw(k.q, v(1), true, evt(2)))},
				{ws: ws(aw(k.p, v(2), true, evt(2))), want: celeriant.CodeWriteClientIdempotency},
			}
		}, 2, 2},
		{"2000/2001 win over 2005 and 2003 on another entry", func(k keys) []step {
			zero := evt(1)
			zero.TypeMajor = 0
			return []step{
				{ws: ws(noCreate(aw(k.p, v(4), true, evt(1))), aw(k.q, nil, true, zero)), want: celeriant.CodeWriteZeroEventType},
				{ws: ws(noCreate(aw(k.p, v(4), true, evt(1))), aw(k.q, nil, true)), want: celeriant.CodeWriteEmptyEventsList},
			}
		}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			modes(t, celeriantsim.Options{}, func(t *testing.T, e env) {
				k := keys{key(), key()}
				clients := map[string]uuid.UUID{"A": uuid.New(), "B": uuid.New()}
				for i, st := range tt.steps(k) {
					c := clients["A"]
					if st.client != "" {
						c = clients[st.client]
					}
					_, err := e.store.Write(ctx, celeriant.WriteRequest{ClientID: c, Writes: st.ws})
					if got := celeriant.CodeOf(err); got != st.want || (st.want == 0 && err != nil) {
						t.Fatalf("step %d: err = %v, want code %d", i, err, st.want)
					}
				}
				for name, want := range map[string]uint64{"p": tt.p, "q": tt.q} {
					kk := k.p
					if name == "q" {
						kk = k.q
					}
					d, err := e.store.AggregateDetails(ctx, kk)
					if want == 0 {
						code(t, err, celeriant.CodeExistsAggregateNotFound)
						continue
					}
					ok(t, err)
					if d.MaxVersion != want {
						t.Fatalf("%s at version %d, want %d", name, d.MaxVersion, want)
					}
				}
			})
		})
	}
}

func ws(w ...celeriant.AggregateWrite) []celeriant.AggregateWrite { return w }

// TestInflightFloorLowerSeq: 2013 covers any sequence at or below an in-flight floor,
// not only the identical one (docs/celeriant-protocol.md section 6.5); other clients are not affected,
// and a 2003 still comes first.
func TestInflightFloorLowerSeq(t *testing.T) {
	modes(t, celeriantsim.Options{}, func(t *testing.T, e env) {
		s, c, k := e.store, uuid.New(), key()
		hold := e.sim.HoldNextWrite()
		done := make(chan error, 1)
		go func() { _, err := s.Write(ctx, wr(c, aw(k, nil, true, evt(3)))); done <- err }()
		<-hold.Prepared()
		_, err := s.Write(ctx, wr(c, aw(k, nil, true, evt(2))))
		code(t, err, celeriant.CodeWriteInflightDuplicate)
		var se *celeriant.ServerError
		if !asServerError(err, &se) || se.LastClientSeq != 3 || se.AttemptedClientSeq != 2 {
			t.Fatalf("detail: %v", err)
		}
		_, err = s.Write(ctx, wr(c, aw(k, celeriant.Version(0), true, evt(2))))
		code(t, err, celeriant.CodeWriteOCC)
		_, err = s.Write(ctx, wr(uuid.New(), aw(k, celeriant.Version(1), true, evt(1))))
		ok(t, err)
		_, err = s.Write(ctx, wr(c, aw(k, nil, true, evt(4))))
		ok(t, err) // above the in-flight floor: accepted
		hold.Commit()
		ok(t, <-done)
		_, err = s.Write(ctx, wr(c, aw(k, nil, true, evt(4))))
		code(t, err, celeriant.CodeWriteClientIdempotency)
	})
}

func asServerError(err error, se **celeriant.ServerError) bool { return errors.As(err, se) }

// TestServerTimestamps: every batch of one write gets the same server timestamp, read
// from the injectable clock in epoch milliseconds (docs/celeriant-protocol.md section 6.8).
func TestServerTimestamps(t *testing.T) {
	modes(t, celeriantsim.Options{}, func(t *testing.T, e env) {
		p, q, c := key(), key(), uuid.New()
		e.clock.Add(1234 * time.Millisecond)
		_, err := e.store.Write(ctx, wr(c, aw(p, nil, true, evt(1)), aw(q, nil, true, evt(1))))
		ok(t, err)
		want := uint64(1_700_000_001_234)
		for _, k := range []celeriant.AggregateKey{p, q} {
			res, err := e.store.Read(ctx, celeriant.ReadRequest{Key: k})
			ok(t, err)
			if got := res.Batches[0].ServerTimestamp; got != want {
				t.Fatalf("server timestamp %d, want %d", got, want)
			}
		}
	})
}

// TestTrimBoundaries: after a trim to 3, reading from 3 works and from 2 gives 1000 with
// the requested and minimum available versions; trimming a missing aggregate is 3000, as
// the server answers a TrimStart (checked against a real server by TestLiveServer).
func TestTrimBoundaries(t *testing.T) {
	modes(t, celeriantsim.Options{}, func(t *testing.T, e env) {
		k, c := key(), uuid.New()
		for i := uint64(1); i <= 3; i++ {
			_, err := e.store.Write(ctx, wr(c, aw(k, nil, true, evt(i))))
			ok(t, err)
		}
		ok(t, e.sim.Trim(k, 3))
		res, err := e.store.Read(ctx, celeriant.ReadRequest{Key: k, Filters: celeriant.ReadFilters{FromVersion: 3}})
		ok(t, err)
		if len(res.Batches) != 1 || res.Batches[0].Version != 3 {
			t.Fatalf("from 3: %+v", res)
		}
		_, err = e.store.Read(ctx, celeriant.ReadRequest{Key: k, Filters: celeriant.ReadFilters{FromVersion: 2}})
		var se *celeriant.ServerError
		if !asServerError(err, &se) || se.Code != celeriant.CodeReadUnavailableVersion || se.Requested != 2 || se.MinimumAvailable != 3 {
			t.Fatalf("from 2: %v", err)
		}
		code(t, e.sim.Trim(key(), 1), celeriant.CodeTrimAggregateNotExists)
	})
}

// TestRawReadFromZero: the server answers a read from version 0 with 1000 (only the
// clients clamp 0 to 1, docs/celeriant-protocol.md section 4.5); the simulator does the same on the wire.
func TestRawReadFromZero(t *testing.T) {
	sim := celeriantsim.New(celeriantsim.Options{})
	t.Cleanup(func() { _ = sim.Close() })
	k := key()
	_, err := sim.Write(ctx, wr(uuid.New(), aw(k, nil, true, evt(1))))
	ok(t, err)
	ln, err := sim.ListenAndServe("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	corr := uuid.New()
	if _, err := nc.Write(bytes.Clone(wire.NewEncoder().ReadRequest(&celeriant.ReadRequest{CorrelationID: corr, Key: k}))); err != nil {
		t.Fatal(err)
	}
	h, body, err := wire.ReadFrame(nc, nil, func(h wire.Header) error { return h.CheckResponse(1 << 20) })
	if err != nil || h.Type != wire.RespError {
		t.Fatalf("answer %+v %v", h, err)
	}
	ef, err := wire.NewDecoder().ErrorResponse(body)
	se := celeriant.NewServerError(celeriant.Code(ef.Code), ef.Message)
	se.CorrelationID = ef.CorrelationID
	if err != nil || se.Code != celeriant.CodeReadUnavailableVersion || se.MinimumAvailable != 1 || se.Requested != 0 || se.CorrelationID != corr {
		t.Fatalf("answer %+v %v", se, err)
	}
}

// TestCloseWhileWriteDelayed: Close returns although a write that had been read from
// the wire, and was waiting out an injected delay, would have taken a hold afterwards
// (nothing could commit it after Close).
func TestCloseWhileWriteDelayed(t *testing.T) {
	sim := celeriantsim.New(celeriantsim.Options{})
	ln, err := sim.ListenAndServe("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sim.SetDelay(500 * time.Millisecond)
	sim.HoldNextWrite()
	c, err := celeriant.New(celeriant.Config{Addrs: []string{ln.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	go func() { _, _ = c.Write(context.Background(), wr(uuid.New(), aw(key(), nil, true, evt(1)))) }()
	deadline := time.Now().Add(5 * time.Second)
	for sim.Stats().Writes == 0 { // the write is in the delay
		if time.Now().After(deadline) {
			t.Fatal("the write never reached the simulator")
		}
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- sim.Close() }()
	select {
	case err := <-closed:
		ok(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs on a write held after Close")
	}
}

// TestCommitDelay: with Options.CommitDelay a write stays in flight before it commits,
// as on the server (TestLiveServer's concurrent_duplicates sees 2013 every time there):
// of two concurrent writes of one sequence, one is held and the other gets 2013; a
// conditional write against the held one's version gets 2003 although no read sees that
// version yet; Close commits the held write (over TCP its answer is lost with the
// connection).
func TestCommitDelay(t *testing.T) {
	modes(t, celeriantsim.Options{CommitDelay: time.Hour}, func(t *testing.T, e env) {
		k, c := key(), uuid.New()
		errs := make(chan error, 2)
		for range 2 {
			go func() { _, err := e.store.Write(ctx, wr(c, aw(k, nil, true, evt(1)))); errs <- err }()
		}
		err := <-errs // the held one answers only after an hour, or at Close
		code(t, err, celeriant.CodeWriteInflightDuplicate)
		var se *celeriant.ServerError
		if !asServerError(err, &se) || se.Message != `{"last_client_seq":1,"attempted_client_seq":1}` {
			t.Fatalf("detail: %v", err)
		}
		_, err = e.store.Read(ctx, celeriant.ReadRequest{Key: k, Filters: celeriant.ReadFilters{FromVersion: 1}})
		code(t, err, celeriant.CodeReadAggregateNotExists)
		_, err = e.store.AggregateDetails(ctx, k)
		code(t, err, celeriant.CodeExistsAggregateNotFound)
		_, err = e.store.Write(ctx, wr(uuid.New(), aw(k, celeriant.Version(0), true, evt(1))))
		if !asServerError(err, &se) || se.Code != celeriant.CodeWriteOCC || se.Message != `{"expected_version":0,"current_aggregate_version":1}` {
			t.Fatalf("expected 0 against the held write: %v", err)
		}
		ok(t, e.sim.Close())
		if err := <-errs; e.store == celeriant.EventStore(e.sim) {
			ok(t, err) // in-process the held write commits and answers
		} else if !celeriant.IsOutcomeUnknown(err) {
			t.Fatalf("held write over TCP after Close: %v, want its answer lost", err) // Close drops the connection
		}
	})
}
