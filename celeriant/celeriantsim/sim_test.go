package celeriantsim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/internal/testclock"
)

type env struct {
	sim   *celeriantsim.Sim
	store celeriant.EventStore
	clock *testclock.Clock // the injectable server clock
}

// modes runs fn against the simulator in-process and through the TCP client.
func modes(t *testing.T, opts celeriantsim.Options, fn func(t *testing.T, e env)) {
	for _, mode := range []string{"inprocess", "tcp"} {
		t.Run(mode, func(t *testing.T) {
			clock := testclock.New(time.UnixMilli(1_700_000_000_000))
			o := opts
			o.Now = clock.Now
			sim := celeriantsim.New(o)
			t.Cleanup(func() { _ = sim.Close() })
			var store celeriant.EventStore = sim
			if mode == "tcp" {
				ln, err := sim.ListenAndServe("127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				c, err := celeriant.New(celeriant.Config{Addrs: []string{ln.Addr().String()}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Close() })
				store = c
			}
			fn(t, e(sim, store, clock))
		})
	}
}

func e(sim *celeriantsim.Sim, store celeriant.EventStore, clock *testclock.Clock) env {
	return env{sim: sim, store: store, clock: clock}
}

var ctx = context.Background()

func key() celeriant.AggregateKey {
	return celeriant.AggregateKey{Org: uuid.New(), Type: uuid.New(), ID: uuid.New()}
}

func evt(seq uint64) celeriant.Event {
	return celeriant.Event{ClientSeq: seq, EventID: uuid.New(), TypeMajor: 1, Value: []byte("v")}
}

func aw(k celeriant.AggregateKey, expected *uint64, enforce bool, evs ...celeriant.Event) celeriant.AggregateWrite {
	return celeriant.AggregateWrite{Key: k, Events: evs, AllowCreate: true, ExpectedVersion: expected, EnforceClientIdempotency: enforce}
}

func wr(client uuid.UUID, ws ...celeriant.AggregateWrite) celeriant.WriteRequest {
	return celeriant.WriteRequest{ClientID: client, Writes: ws}
}

func code(t *testing.T, err error, want celeriant.Code) {
	t.Helper()
	if got := celeriant.CodeOf(err); got != want {
		t.Fatalf("err = %v, want code %d", err, want)
	}
}

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestWriteChecks(t *testing.T) {
	modes(t, celeriantsim.Options{}, func(t *testing.T, e env) {
		s, c := e.store, uuid.New()
		k := key()
		_, err := s.Write(ctx, wr(c))
		code(t, err, celeriant.CodeShardRoutingIncompatible)
		_, err = s.Write(ctx, wr(c, aw(k, nil, true)))
		code(t, err, celeriant.CodeWriteEmptyEventsList)
		zero := evt(1)
		zero.TypeMajor = 0
		_, err = s.Write(ctx, wr(c, aw(k, nil, true, zero)))
		code(t, err, celeriant.CodeWriteZeroEventType)
		// 2000/2001 are checked for every entry before any version guard.
		_, err = s.Write(ctx, wr(c, aw(key(), celeriant.Version(9), true, evt(1)), aw(k, nil, true)))
		code(t, err, celeriant.CodeWriteEmptyEventsList)
		// expected 0 without allowCreate on a missing aggregate: 2005, not 2003.
		noCreate := aw(k, celeriant.Version(0), true, evt(1))
		noCreate.AllowCreate = false
		_, err = s.Write(ctx, wr(c, noCreate))
		code(t, err, celeriant.CodeWriteAggregateNotExists)
		res, err := s.Write(ctx, wr(c, aw(k, celeriant.Version(0), true, evt(1), evt(2))))
		ok(t, err)
		if res.Version != 1 {
			t.Fatalf("version %d", res.Version)
		}
		// expected 0 = "must not exist yet".
		_, err = s.Write(ctx, wr(c, aw(k, celeriant.Version(0), true, evt(3))))
		code(t, err, celeriant.CodeWriteOCC)
		// An existing aggregate needs no allowCreate; +1 version per write whatever the
		// event count; event seqs continue.
		more := aw(k, celeriant.Version(1), true, evt(3), evt(4), evt(5))
		more.AllowCreate = false
		res, err = s.Write(ctx, wr(c, more))
		ok(t, err)
		d, err := s.AggregateDetails(ctx, k)
		ok(t, err)
		if res.Version != 2 || d.MaxVersion != 2 || d.MaxEventSeq != 5 || d.MinVersion != 1 || d.LastClientID != c {
			t.Fatalf("res %+v details %+v", res, d)
		}
		_, err = s.AggregateDetails(ctx, key())
		code(t, err, celeriant.CodeExistsAggregateNotFound)
	})
}

// TestFloor: the floor is the maximum seq ever written, raised by non-enforced writes
// too; only the lowest seq of a write is compared (docs/celeriant-protocol.md section 6.4).
func TestFloor(t *testing.T) {
	modes(t, celeriantsim.Options{}, func(t *testing.T, e env) {
		s, c, other := e.store, uuid.New(), uuid.New()
		k := key()
		_, err := s.Write(ctx, wr(c, aw(k, nil, false, evt(5))))
		ok(t, err)
		_, err = s.Write(ctx, wr(c, aw(k, nil, true, evt(5))))
		code(t, err, celeriant.CodeWriteClientIdempotency)
		var se *celeriant.ServerError
		if !errors.As(err, &se) || se.LastClientSeq != 5 || se.AttemptedClientSeq != 5 ||
			se.Message != `{"last_client_seq":5,"attempted_client_seq":5}` {
			t.Fatalf("detail %+v", se)
		}
		// Not enforced: lands, and a lower seq does not lower the floor.
		_, err = s.Write(ctx, wr(c, aw(k, nil, false, evt(2))))
		ok(t, err)
		_, err = s.Write(ctx, wr(c, aw(k, nil, true, evt(5))))
		code(t, err, celeriant.CodeWriteClientIdempotency)
		// Another client has its own floor.
		_, err = s.Write(ctx, wr(other, aw(k, nil, true, evt(1))))
		ok(t, err)
		// Lowest seq 6 > floor 5 passes even with a gap and unsorted seqs.
		_, err = s.Write(ctx, wr(c, aw(k, nil, true, evt(9), evt(6))))
		ok(t, err)
		_, err = s.Write(ctx, wr(c, aw(k, nil, true, evt(8))))
		code(t, err, celeriant.CodeWriteClientIdempotency)
	})
}

func TestMultiAggregateAllOrNothing(t *testing.T) {
	modes(t, celeriantsim.Options{}, func(t *testing.T, e env) {
		s, c := e.store, uuid.New()
		a, b := key(), key()
		res, err := s.Write(ctx, wr(c, aw(a, celeriant.Version(0), true, evt(1)), aw(b, celeriant.Version(0), true, evt(1))))
		ok(t, err)
		if res.Version != 0 {
			t.Fatalf("multi-aggregate write reported version %d", res.Version)
		}
		// b's guard fails: a must not change.
		_, err = s.Write(ctx, wr(c, aw(a, celeriant.Version(1), true, evt(2)), aw(b, celeriant.Version(7), true, evt(2))))
		code(t, err, celeriant.CodeWriteOCC)
		d, err := s.AggregateDetails(ctx, a)
		ok(t, err)
		if d.MaxVersion != 1 {
			t.Fatalf("a moved to %d", d.MaxVersion)
		}
		// The floor of a was not raised either.
		_, err = s.Write(ctx, wr(c, aw(a, celeriant.Version(1), true, evt(2))))
		ok(t, err)
	})
}

func TestShardRouting(t *testing.T) {
	modes(t, celeriantsim.Options{Shards: 2}, func(t *testing.T, e env) {
		even, odd := key(), key()
		even.ID[15], odd.ID[15] = 2, 3
		even2 := key()
		even2.ID[15] = 4
		_, err := e.store.Write(ctx, wr(uuid.New(), aw(even, nil, false, evt(1)), aw(odd, nil, false, evt(1))))
		code(t, err, celeriant.CodeShardRoutingMultipleShards)
		_, err = e.store.Write(ctx, wr(uuid.New(), aw(even, nil, false, evt(1)), aw(even2, nil, false, evt(1))))
		ok(t, err)
	})
}

func TestInflight2013Then2002(t *testing.T) {
	modes(t, celeriantsim.Options{}, func(t *testing.T, e env) {
		s, c, k := e.store, uuid.New(), key()
		hold := e.sim.HoldNextWrite()
		done := make(chan error, 1)
		go func() { _, err := s.Write(ctx, wr(c, aw(k, celeriant.Version(0), true, evt(1)))); done <- err }()
		<-hold.Prepared()
		// The version counter includes the in-flight write; the floor is in flight.
		_, err := s.Write(ctx, wr(c, aw(k, celeriant.Version(0), true, evt(1))))
		code(t, err, celeriant.CodeWriteOCC)
		_, err = s.Write(ctx, wr(c, aw(k, celeriant.Version(1), true, evt(1))))
		code(t, err, celeriant.CodeWriteInflightDuplicate)
		_, err = s.Write(ctx, wr(c, aw(k, nil, true, evt(1))))
		code(t, err, celeriant.CodeWriteInflightDuplicate)
		_, err = s.Read(ctx, celeriant.ReadRequest{Key: k})
		code(t, err, celeriant.CodeReadAggregateNotExists)
		hold.Commit()
		ok(t, <-done)
		_, err = s.Write(ctx, wr(c, aw(k, celeriant.Version(1), true, evt(1))))
		code(t, err, celeriant.CodeWriteClientIdempotency)
	})
}

func TestFaults(t *testing.T) {
	modes(t, celeriantsim.Options{}, func(t *testing.T, e env) {
		s, c, k := e.store, uuid.New(), key()
		e.sim.ForceConflict()
		_, err := s.Write(ctx, wr(c, aw(k, celeriant.Version(0), true, evt(1))))
		code(t, err, celeriant.CodeWriteOCC)
		e.sim.ForceInflightDuplicate()
		_, err = s.Write(ctx, wr(c, aw(k, celeriant.Version(0), true, evt(1))))
		code(t, err, celeriant.CodeWriteInflightDuplicate)
		if _, err := s.AggregateDetails(ctx, k); !celeriant.IsNotFound(err) {
			t.Fatalf("forced errors must not apply the write: %v", err)
		}
		e.sim.LoseNextWriteAnswer()
		_, err = s.Write(ctx, wr(c, aw(k, celeriant.Version(0), true, evt(1))))
		if !celeriant.IsOutcomeUnknown(err) {
			t.Fatalf("lost answer: %v", err)
		}
		_, err = s.Write(ctx, wr(c, aw(k, celeriant.Version(1), true, evt(2))))
		ok(t, err)
		// Replica lag hides the newest batch from reads and details.
		e.sim.SetReadLag(1)
		d, err := s.AggregateDetails(ctx, k)
		ok(t, err)
		res, err := s.Read(ctx, celeriant.ReadRequest{Key: k})
		ok(t, err)
		if d.MaxVersion != 1 || len(res.Batches) != 1 {
			t.Fatalf("lagging: details %d, %d batches", d.MaxVersion, len(res.Batches))
		}
		e.sim.SetReadLag(2)
		_, err = s.Read(ctx, celeriant.ReadRequest{Key: k})
		code(t, err, celeriant.CodeReadAggregateNotExists)
		e.sim.SetReadLag(0)
		res, err = s.Read(ctx, celeriant.ReadRequest{Key: k})
		ok(t, err)
		if len(res.Batches) != 2 {
			t.Fatalf("%d batches", len(res.Batches))
		}
		for range 4 { // the TCP client re-sends a busy request three times
			e.sim.InjectReadError(celeriant.CodeServerBusy, "")
		}
		_, err = s.AggregateDetails(ctx, k)
		if !celeriant.IsBusy(err) {
			t.Fatalf("injected read error: %v", err)
		}
	})
}

func TestDelayThenCommitAnyway(t *testing.T) {
	sim := celeriantsim.New(celeriantsim.Options{})
	sim.SetDelay(20 * time.Millisecond)
	k := key()
	// The caller gives up once the server has the write (held after the delay), not
	// after a millisecond that a loaded machine may spend before the write is sent.
	hold := sim.HoldNextWrite()
	c, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { <-hold.Prepared(); cancel() }()
	_, err := sim.Write(c, wr(uuid.New(), aw(k, nil, true, evt(1))))
	if !celeriant.IsOutcomeUnknown(err) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	hold.Commit()
	// The server processes it although the caller gave up.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := sim.AggregateDetails(ctx, k); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("delayed write never committed")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestReadFilters(t *testing.T) {
	modes(t, celeriantsim.Options{}, func(t *testing.T, e env) {
		s, k := e.store, key()
		us, them, user := uuid.New(), uuid.New(), uuid.New()
		typed := func(seq, typ uint64) celeriant.Event {
			ev := evt(seq)
			ev.TypeMajor, ev.Timestamp = typ, 100*seq
			return ev
		}
		// v1 us seqs 1,2 (t=1000); v2 them seq 1 (t=2000); v3 us seqs 3,4 types 2,3 user (t=3000).
		_, err := s.Write(ctx, wr(us, aw(k, nil, true, typed(1, 1), typed(2, 1))))
		ok(t, err)
		e.clock.Add(time.Second)
		_, err = s.Write(ctx, wr(them, aw(k, nil, true, typed(1, 1))))
		ok(t, err)
		e.clock.Add(time.Second)
		w := wr(us, aw(k, nil, true, typed(3, 2), typed(4, 3)))
		w.UserID = user
		_, err = s.Write(ctx, w)
		ok(t, err)
		t0 := uint64(1_700_000_000_000)
		type want struct {
			versions []uint64
			events   int
		}
		u := celeriant.Uint64
		tests := []struct {
			name string
			f    celeriant.ReadFilters
			want want
		}{
			{"all (from 0 sent as 1)", celeriant.ReadFilters{}, want{[]uint64{1, 2, 3}, 5}},
			{"from 2 to 2", celeriant.ReadFilters{FromVersion: 2, ToVersion: u(2)}, want{[]uint64{2}, 1}},
			{"beyond the tip", celeriant.ReadFilters{FromVersion: 9}, want{nil, 0}},
			{"include client", celeriant.ReadFilters{IncludeClientID: us}, want{[]uint64{1, 3}, 4}},
			{"exclude client", celeriant.ReadFilters{ExcludeClientID: us}, want{[]uint64{2}, 1}},
			{"point read seq 2 of us", celeriant.ReadFilters{IncludeClientID: us, MinClientSeq: u(2), MaxClientSeq: u(2)}, want{[]uint64{1}, 1}},
			{"point read seq 1 (both clients)", celeriant.ReadFilters{MinClientSeq: u(1), MaxClientSeq: u(1)}, want{[]uint64{1, 2}, 2}},
			{"min server ts inclusive", celeriant.ReadFilters{MinServerTimestamp: u(t0 + 1000)}, want{[]uint64{2, 3}, 3}},
			{"max server ts inclusive", celeriant.ReadFilters{MaxServerTimestamp: u(t0 + 1000)}, want{[]uint64{1, 2}, 3}},
			{"event types", celeriant.ReadFilters{EventTypes: []uint64{3}}, want{[]uint64{3}, 1}},
			{"include user", celeriant.ReadFilters{IncludeUserID: user}, want{[]uint64{3}, 2}},
			{"exclude user", celeriant.ReadFilters{ExcludeUserID: user}, want{[]uint64{1, 2}, 3}},
			{"event timestamp", celeriant.ReadFilters{MinEventTimestamp: u(200), MaxEventTimestamp: u(300)}, want{[]uint64{1, 3}, 2}},
			{"event seq", celeriant.ReadFilters{MinEventSeq: u(3), MaxEventSeq: u(4)}, want{[]uint64{2, 3}, 2}},
		}
		for _, tt := range tests {
			res, err := s.Read(ctx, celeriant.ReadRequest{Key: k, Filters: tt.f})
			ok(t, err)
			var vs []uint64
			n := 0
			for _, b := range res.Batches {
				vs = append(vs, b.Version)
				n += len(b.Events)
			}
			if len(vs) != len(tt.want.versions) || n != tt.want.events || res.NextVersion != 0 {
				t.Errorf("%s: versions %v events %d next %d; want %v %d", tt.name, vs, n, res.NextVersion, tt.want.versions, tt.want.events)
				continue
			}
			for i := range vs {
				if vs[i] != tt.want.versions[i] {
					t.Errorf("%s: versions %v", tt.name, vs)
				}
			}
		}
		res, err := s.Read(ctx, celeriant.ReadRequest{Key: k, Filters: celeriant.ReadFilters{FromVersion: 3}})
		ok(t, err)
		b := res.Batches[0]
		if b.ServerTimestamp != t0+2000 || b.UserID != user || b.ClientID != us || b.Events[1].EventSeq != 5 || b.Events[1].Timestamp != 400 {
			t.Fatalf("batch %+v", b)
		}
		_, err = s.Read(ctx, celeriant.ReadRequest{Key: key()})
		code(t, err, celeriant.CodeReadAggregateNotExists)
	})
}

func TestTrim(t *testing.T) {
	modes(t, celeriantsim.Options{}, func(t *testing.T, e env) {
		s, c, k := e.store, uuid.New(), key()
		for i := uint64(1); i <= 4; i++ {
			_, err := s.Write(ctx, wr(c, aw(k, nil, true, evt(i))))
			ok(t, err)
		}
		code(t, e.sim.Trim(k, 9), celeriant.CodeTrimIndexOutOfRange)
		ok(t, e.sim.Trim(k, 3))
		ok(t, e.sim.Trim(k, 2)) // below the current minimum: no-op
		_, err := s.Read(ctx, celeriant.ReadRequest{Key: k})
		if min, isUV := celeriant.IsUnavailableVersion(err); !isUV || min != 3 {
			t.Fatalf("read from 1 after trim: %v", err)
		}
		res, err := s.Read(ctx, celeriant.ReadRequest{Key: k, Filters: celeriant.ReadFilters{FromVersion: 3}})
		ok(t, err)
		if len(res.Batches) != 2 {
			t.Fatalf("%d batches", len(res.Batches))
		}
		d, err := s.AggregateDetails(ctx, k)
		ok(t, err)
		if d.MinVersion != 3 || d.MaxVersion != 4 {
			t.Fatalf("details %+v", d)
		}
		// Trim resets neither the version counter nor the floor.
		_, err = s.Write(ctx, wr(c, aw(k, celeriant.Version(4), true, evt(4))))
		code(t, err, celeriant.CodeWriteClientIdempotency)
		res2, err := s.Write(ctx, wr(c, aw(k, celeriant.Version(4), true, evt(5))))
		ok(t, err)
		if res2.Version != 5 {
			t.Fatalf("version after trim %d", res2.Version)
		}
	})
}

func TestPaging(t *testing.T) {
	modes(t, celeriantsim.Options{PageBatches: 2}, func(t *testing.T, e env) {
		s, c, k := e.store, uuid.New(), key()
		for i := uint64(1); i <= 5; i++ {
			_, err := s.Write(ctx, wr(c, aw(k, nil, true, evt(i))))
			ok(t, err)
		}
		var got []uint64
		from := uint64(1)
		for pages := 0; ; pages++ {
			if pages > 5 {
				t.Fatal("paging does not end")
			}
			res, err := s.Read(ctx, celeriant.ReadRequest{Key: k, Filters: celeriant.ReadFilters{FromVersion: from}})
			ok(t, err)
			for _, b := range res.Batches {
				got = append(got, b.Version)
			}
			if res.NextVersion == 0 {
				break
			}
			from = res.NextVersion
		}
		if len(got) != 5 || got[4] != 5 {
			t.Fatalf("versions %v", got)
		}
	})
}

// TestValuesAreCopied: the caller's buffers and the log never alias in-process.
func TestValuesAreCopied(t *testing.T) {
	sim := celeriantsim.New(celeriantsim.Options{})
	k := key()
	ev := evt(1)
	_, err := sim.Write(ctx, wr(uuid.New(), aw(k, nil, true, ev)))
	ok(t, err)
	ev.Value[0] = 'X'
	res, err := sim.Read(ctx, celeriant.ReadRequest{Key: k})
	ok(t, err)
	res.Batches[0].Events[0].Value[0] = 'Y'
	res, err = sim.Read(ctx, celeriant.ReadRequest{Key: k})
	ok(t, err)
	if string(res.Batches[0].Events[0].Value) != "v" {
		t.Fatalf("value %q", res.Batches[0].Events[0].Value)
	}
}
