package celeriant_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
)

// ruleTarget is one server the rules suite runs against: the simulator in-process, the
// client over TCP to the simulator, or the client to a real server (TestLiveServer).
type ruleTarget struct {
	s     celeriant.EventStore
	watch celeriant.Watcher
	// trim soft-trims an aggregate (the simulator's Sim.Trim, or a TrimStart request
	// sent to a real server).
	trim func(ctx context.Context, key celeriant.AggregateKey, keepFrom uint64) error
	// pageBytes is the server's read page budget in bytes of event payload
	// (--max-response-size): paging writes batches that add up to more than that.
	pageBytes int
}

// simTargets returns the simulator in-process and the client over TCP to a simulator,
// both with a 64 KiB page budget.
func simTargets(t *testing.T) map[string]ruleTarget {
	opts := celeriantsim.Options{MaxResponseSize: 64 << 10}
	inproc := celeriantsim.New(opts)
	t.Cleanup(func() { _ = inproc.Close() })
	_, addr := startSim(t, opts)
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	trim := func(s *celeriantsim.Sim) func(context.Context, celeriant.AggregateKey, uint64) error {
		return func(_ context.Context, key celeriant.AggregateKey, keepFrom uint64) error {
			return s.Trim(key, keepFrom)
		}
	}
	return map[string]ruleTarget{
		"sim-inprocess": {s: inproc, watch: inproc, trim: trim(inproc), pageBytes: 64 << 10},
		// Over TCP the trim is a TrimStart request, as on a real server.
		"client-tcp-sim": {s: c, watch: c, trim: trimOverWire(addr), pageBytes: 64 << 10},
	}
}

// TestServerRules runs the rules suite against the simulator, in-process and over TCP.
func TestServerRules(t *testing.T) {
	for name, tg := range simTargets(t) {
		t.Run(name, func(t *testing.T) { runServerRules(t, tg) })
	}
}

// runServerRules pins the server's client-visible rules (docs/celeriant-protocol.md
// sections 4-6) that the invariant suite does not: expected versions, event fields,
// the sequence floor, 2002 versus 2013, the check order, multi-aggregate atomicity,
// every read filter, paging, aggregate details, trimmed ranges, the JSON details of
// the errors and Watch. Messages are compared byte for byte: the server formats them
// itself, and the simulator must format them the same way.
func runServerRules(t *testing.T, tg ruleTarget) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := tg.s
	v := celeriant.Version
	write := func(client uuid.UUID, ws ...celeriant.AggregateWrite) (celeriant.WriteResult, error) {
		return s.Write(ctx, celeriant.WriteRequest{ClientID: client, Writes: ws})
	}
	entry := func(key celeriant.AggregateKey, expected *uint64, seqs ...uint64) celeriant.AggregateWrite {
		w := celeriant.AggregateWrite{Key: key, AllowCreate: true, ExpectedVersion: expected, EnforceClientIdempotency: true}
		for _, q := range seqs {
			w.Events = append(w.Events, celeriant.Event{ClientSeq: q, TypeMajor: 1, Value: []byte("{}")})
		}
		return w
	}
	noCreate := func(w celeriant.AggregateWrite) celeriant.AggregateWrite { w.AllowCreate = false; return w }
	unenforced := func(w celeriant.AggregateWrite) celeriant.AggregateWrite {
		w.EnforceClientIdempotency = false
		return w
	}
	// wantErr checks the code and the exact message of err.
	wantErr := func(t *testing.T, step string, err error, code celeriant.Code, msg string) {
		t.Helper()
		var se *celeriant.ServerError
		if !errors.As(err, &se) || se.Code != code || se.Message != msg {
			t.Fatalf("%s: err = %v, want code %d with message %s", step, err, code, msg)
		}
	}
	wantVersion := func(t *testing.T, step string, res celeriant.WriteResult, err error, version uint64) {
		t.Helper()
		if err != nil || res.Version != version {
			t.Fatalf("%s: %+v, %v; want version %d", step, res, err, version)
		}
	}
	details := func(t *testing.T, key celeriant.AggregateKey) celeriant.AggregateDetails {
		t.Helper()
		d, err := s.AggregateDetails(ctx, key)
		if err != nil {
			t.Fatalf("details of %s: %v", key, err)
		}
		return d
	}
	missing := func(t *testing.T, step string, key celeriant.AggregateKey) {
		t.Helper()
		_, err := s.AggregateDetails(ctx, key)
		wantErr(t, step+": details", err, celeriant.CodeExistsAggregateNotFound, "{}")
		_, err = s.Read(ctx, celeriant.ReadRequest{Key: key, Filters: celeriant.ReadFilters{FromVersion: 1}})
		wantErr(t, step+": read", err, celeriant.CodeReadAggregateNotExists, "{}")
	}
	readAll := func(t *testing.T, key celeriant.AggregateKey, f celeriant.ReadFilters) []celeriant.Batch {
		t.Helper()
		b, err := celeriant.ReadAll(ctx, s, celeriant.ReadRequest{Key: key, Filters: f})
		if err != nil {
			t.Fatalf("read %+v: %v", f, err)
		}
		return b
	}

	t.Run("expected_versions", func(t *testing.T) {
		key, client := freshKey(), uuid.New()
		res, err := write(client, entry(key, nil, 1))
		wantVersion(t, "unconditional create", res, err, 1)
		_, err = write(client, entry(key, v(0), 2))
		wantErr(t, "0 on an existing aggregate", err, celeriant.CodeWriteOCC, `{"expected_version":0,"current_aggregate_version":1}`)
		res, err = write(client, noCreate(entry(key, v(1), 2)))
		wantVersion(t, "the current version, existing without allowCreate", res, err, 2)
		_, err = write(client, entry(key, v(5), 3))
		wantErr(t, "a version ahead", err, celeriant.CodeWriteOCC, `{"expected_version":5,"current_aggregate_version":2}`)
		res, err = write(client, noCreate(entry(key, nil, 3)))
		wantVersion(t, "unconditional on an existing aggregate", res, err, 3)

		fresh := freshKey()
		_, err = write(client, entry(fresh, v(3), 1))
		wantErr(t, "n on a missing aggregate", err, celeriant.CodeWriteOCC, `{"expected_version":3,"current_aggregate_version":0}`)
		_, err = write(client, noCreate(entry(fresh, nil, 1)))
		wantErr(t, "nil without allowCreate", err, celeriant.CodeWriteAggregateNotExists, "{}")
		_, err = write(client, noCreate(entry(fresh, v(0), 1)))
		wantErr(t, "0 without allowCreate", err, celeriant.CodeWriteAggregateNotExists, "{}")
		_, err = write(client, noCreate(entry(fresh, v(3), 1)))
		wantErr(t, "existence before the version guard", err, celeriant.CodeWriteAggregateNotExists, "{}")
		missing(t, "after refused creates", fresh)
		res, err = write(client, entry(fresh, v(0), 1))
		wantVersion(t, "0 creates", res, err, 1)
	})

	t.Run("event_fields", func(t *testing.T) {
		key, client, user := freshKey(), uuid.New(), uuid.New()
		iv := []byte("twelve bytes")
		big := bytes.Repeat([]byte{0xa5}, 3000)
		evs := []celeriant.Event{
			{ClientSeq: 5, EventID: uuid.New(), Timestamp: 1700000000000, TypeMajor: 1, TypeMinor: 0, Value: []byte(`{"a":1}`)},
			{ClientSeq: 3, Timestamp: 0, TypeMajor: 2, TypeMinor: 7, Value: []byte{}, IV: iv},
			{ClientSeq: 9, EventID: uuid.New(), Timestamp: 1<<63 + 1, TypeMajor: 1 << 40, TypeMinor: 1 << 33, Value: big},
		}
		before := uint64(time.Now().UnixMilli())
		res, err := s.Write(ctx, celeriant.WriteRequest{ClientID: client, UserID: user, Writes: []celeriant.AggregateWrite{{
			Key: key, Events: evs, AllowCreate: true, ExpectedVersion: v(0), EnforceClientIdempotency: true,
		}}})
		wantVersion(t, "three events", res, err, 1)
		after := uint64(time.Now().UnixMilli())
		res, err = write(client, entry(key, v(1), 10))
		wantVersion(t, "one more", res, err, 2)

		got := readAll(t, key, celeriant.ReadFilters{FromVersion: 1})
		if len(got) != 2 {
			t.Fatalf("%d batches, want 2", len(got))
		}
		b := got[0]
		// The server's clock and ours are one machine's; allow 1 s either way.
		if b.Version != 1 || b.ClientID != client || b.UserID != user || b.ServerTimestamp+1000 < before || b.ServerTimestamp > after+1000 {
			t.Fatalf("batch 1: version %d client %s user %s server time %d (written between %d and %d)",
				b.Version, b.ClientID, b.UserID, b.ServerTimestamp, before, after)
		}
		for i := range evs {
			want := evs[i]
			want.EventSeq = uint64(i + 1)
			if len(want.Value) == 0 {
				want.Value = []byte{}
			}
			e := b.Events[i]
			if e.ClientSeq != want.ClientSeq || e.EventSeq != want.EventSeq || e.EventID != want.EventID || e.Timestamp != want.Timestamp ||
				e.TypeMajor != want.TypeMajor || e.TypeMinor != want.TypeMinor || !bytes.Equal(e.Value, want.Value) || !bytes.Equal(e.IV, want.IV) {
				t.Fatalf("event %d: got %+v, want %+v", i, e, want)
			}
		}
		if b2 := got[1]; b2.Version != 2 || b2.UserID != uuid.Nil || len(b2.Events) != 1 || b2.Events[0].EventSeq != 4 || b2.ServerTimestamp < b.ServerTimestamp {
			t.Fatalf("batch 2: %+v", b2)
		}
		d := details(t, key)
		want := celeriant.AggregateDetails{CorrelationID: d.CorrelationID, MinVersion: 1, MaxVersion: 2, MaxEventSeq: 4,
			LastServerTimestamp: got[1].ServerTimestamp, LastClientID: client, LastUserID: uuid.Nil}
		if d != want {
			t.Fatalf("details %+v, want %+v", d, want)
		}
	})

	t.Run("sequence_floor", func(t *testing.T) {
		key, client, other := freshKey(), uuid.New(), uuid.New()
		steps := []struct {
			client uuid.UUID
			w      celeriant.AggregateWrite
			code   celeriant.Code
			msg    string
		}{
			{client, entry(key, nil, 5), 0, ""},
			{client, entry(key, nil, 7, 3), celeriant.CodeWriteClientIdempotency, `{"last_client_seq":5,"attempted_client_seq":3}`},
			{client, entry(key, nil, 6, 6), 0, ""},          // only the lowest is compared; no uniqueness within a write
			{client, unenforced(entry(key, nil, 1)), 0, ""}, // not checked, and the floor stays at its maximum
			{client, entry(key, nil, 6), celeriant.CodeWriteClientIdempotency, `{"last_client_seq":6,"attempted_client_seq":6}`},
			{client, unenforced(entry(key, nil, 10)), 0, ""}, // unenforced writes raise the floor
			{client, entry(key, nil, 8), celeriant.CodeWriteClientIdempotency, `{"last_client_seq":10,"attempted_client_seq":8}`},
			{other, entry(key, nil, 1), 0, ""}, // a floor per client id
			{client, entry(key, v(4), 1), celeriant.CodeWriteOCC, `{"expected_version":4,"current_aggregate_version":5}`}, // the version guard first
			{client, entry(key, v(5), 11), 0, ""},
		}
		for i, st := range steps {
			_, err := write(st.client, st.w)
			if st.code == 0 {
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				continue
			}
			wantErr(t, fmt.Sprintf("step %d", i), err, st.code, st.msg)
		}
		if d := details(t, key); d.MaxVersion != 6 {
			t.Fatalf("version %d, want 6", d.MaxVersion)
		}
	})

	t.Run("client_seq_zero", func(t *testing.T) {
		// A committed floor of 0 is no floor.
		key, client := freshKey(), uuid.New()
		for i := range 2 {
			if _, err := write(client, entry(key, nil, 0)); err != nil {
				t.Fatalf("seq 0, write %d: %v", i+1, err)
			}
		}
		if _, err := write(client, entry(key, nil, 1)); err != nil {
			t.Fatal(err)
		}
		_, err := write(client, entry(key, nil, 0))
		wantErr(t, "seq 0 above a floor", err, celeriant.CodeWriteClientIdempotency, `{"last_client_seq":1,"attempted_client_seq":0}`)
	})

	t.Run("concurrent_duplicates", func(t *testing.T) {
		// Two enforced writes of one sequence at once: one lands, the other gets 2013
		// while the first is in flight or 2002 once it committed. Never both, never 2003
		// (no expected version).
		client := uuid.New()
		counts := map[celeriant.Code]int{}
		for range 20 {
			key := freshKey()
			if _, err := write(client, entry(key, nil, 1)); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = write(client, entry(key, nil, 2))
				}()
			}
			wg.Wait()
			ok := 0
			for _, err := range errs {
				if err == nil {
					ok++
					continue
				}
				var se *celeriant.ServerError
				if !errors.As(err, &se) || (se.Code != celeriant.CodeWriteClientIdempotency && se.Code != celeriant.CodeWriteInflightDuplicate) ||
					se.Message != `{"last_client_seq":2,"attempted_client_seq":2}` {
					t.Fatalf("loser: %v", err)
				}
				counts[se.Code]++
			}
			if ok != 1 {
				t.Fatalf("%d of 2 duplicates landed: %v", ok, errs)
			}
			_, err := write(client, entry(key, nil, 2))
			wantErr(t, "after both answered", err, celeriant.CodeWriteClientIdempotency, `{"last_client_seq":2,"attempted_client_seq":2}`)
		}
		t.Logf("losers: %d got 2002, %d got 2013", counts[celeriant.CodeWriteClientIdempotency], counts[celeriant.CodeWriteInflightDuplicate])
	})

	t.Run("check_order", func(t *testing.T) {
		key, other, client := freshKey(), freshKey(), uuid.New()
		if _, err := write(client, entry(key, nil, 1)); err != nil {
			t.Fatal(err)
		}
		_, err := write(client)
		wantErr(t, "empty writes", err, celeriant.CodeShardRoutingIncompatible, `{"detail":"Write request must contain at least one write operation.","num_shards":1}`)
		empty := entry(other, nil)
		_, err = write(client, entry(key, v(7), 1), empty)
		wantErr(t, "no events, with a stale version on another entry", err, celeriant.CodeWriteEmptyEventsList, "{}")
		zero := entry(other, nil, 4)
		zero.Events = append(zero.Events, celeriant.Event{ClientSeq: 6, TypeMajor: 0})
		_, err = write(client, entry(key, v(7), 1), zero)
		wantErr(t, "type 0", err, celeriant.CodeWriteZeroEventType, `{"client_seq":6}`)
		missing(t, "after refused writes", other)
		if d := details(t, key); d.MaxVersion != 1 {
			t.Fatalf("version %d, want 1", d.MaxVersion)
		}
	})

	t.Run("multi_aggregate", func(t *testing.T) {
		p, q, r, client := freshKey(), freshKey(), freshKey(), uuid.New()
		res, err := write(client, entry(p, v(0), 1), entry(q, v(0), 1))
		wantVersion(t, "two creates", res, err, 0) // no version for a multi-aggregate write
		dp, dq := details(t, p), details(t, q)
		if dp.MaxVersion != 1 || dq.MaxVersion != 1 || dp.LastServerTimestamp != dq.LastServerTimestamp {
			t.Fatalf("after a two-aggregate write: %+v %+v", dp, dq)
		}
		_, err = write(client, entry(p, v(1), 2), entry(r, v(0), 1), entry(q, v(0), 2))
		wantErr(t, "a stale version on one entry", err, celeriant.CodeWriteOCC, `{"expected_version":0,"current_aggregate_version":1}`)
		_, err = write(client, entry(p, v(1), 2), entry(r, v(0), 1), entry(q, v(1), 1))
		wantErr(t, "a used sequence on one entry", err, celeriant.CodeWriteClientIdempotency, `{"last_client_seq":1,"attempted_client_seq":1}`)
		_, err = write(client, entry(p, v(1), 2), noCreate(entry(r, nil, 1)))
		wantErr(t, "a missing aggregate without allowCreate", err, celeriant.CodeWriteAggregateNotExists, "{}")
		missing(t, "r", r)
		if dp, dq := details(t, p), details(t, q); dp.MaxVersion != 1 || dq.MaxVersion != 1 {
			t.Fatalf("refused writes changed versions: %d %d", dp.MaxVersion, dq.MaxVersion)
		}
		res, err = write(client, entry(p, v(1), 2), entry(q, v(1), 2), entry(r, v(0), 1))
		wantVersion(t, "three", res, err, 0)
		for _, k := range []celeriant.AggregateKey{p, q} {
			if b := readAll(t, k, celeriant.ReadFilters{FromVersion: 1}); len(b) != 2 || b[1].Events[0].ClientSeq != 2 {
				t.Fatalf("%s: %+v", k, b)
			}
		}
	})

	t.Run("read_filters", func(t *testing.T) {
		key, a, b, u1, u2 := freshKey(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
		ev := func(seq, typ, ts uint64) celeriant.Event {
			return celeriant.Event{ClientSeq: seq, TypeMajor: typ, Timestamp: ts, Value: []byte(fmt.Sprint(seq))}
		}
		batches := []struct {
			client, user uuid.UUID
			events       []celeriant.Event
		}{
			{a, u1, []celeriant.Event{ev(1, 1, 100), ev(2, 2, 200)}}, // v1: event seqs 1, 2
			{b, uuid.Nil, []celeriant.Event{ev(1, 1, 300)}},          // v2: 3
			{a, u2, []celeriant.Event{ev(3, 3, 400), ev(4, 1, 500)}}, // v3: 4, 5
			{b, u1, []celeriant.Event{ev(2, 2, 600)}},                // v4: 6
		}
		for i, bt := range batches {
			_, err := s.Write(ctx, celeriant.WriteRequest{ClientID: bt.client, UserID: bt.user, Writes: []celeriant.AggregateWrite{{
				Key: key, Events: bt.events, AllowCreate: true, ExpectedVersion: v(uint64(i)), EnforceClientIdempotency: true}}})
			if err != nil {
				t.Fatalf("batch %d: %v", i+1, err)
			}
		}
		all := readAll(t, key, celeriant.ReadFilters{FromVersion: 1})
		if len(all) != 4 {
			t.Fatalf("%d batches, want 4", len(all))
		}
		ts := func(version int) *uint64 { return v(all[version-1].ServerTimestamp) }
		// shape lists version:event seqs of what a read returned.
		shape := func(bs []celeriant.Batch) string {
			out := ""
			for _, b := range bs {
				out += fmt.Sprintf("v%d:", b.Version)
				for _, e := range b.Events {
					out += fmt.Sprint(e.EventSeq)
				}
				out += " "
			}
			return out
		}
		// model applies the filters to all as docs/celeriant-protocol.md section 4.5 says.
		model := func(f celeriant.ReadFilters) string {
			var out []celeriant.Batch
			in := func(x uint64, lo, hi *uint64) bool { return (lo == nil || x >= *lo) && (hi == nil || x <= *hi) }
			for _, bt := range all {
				if bt.Version < max(f.FromVersion, 1) || (f.ToVersion != nil && bt.Version > *f.ToVersion) ||
					(f.ExcludeClientID != uuid.Nil && bt.ClientID == f.ExcludeClientID) ||
					(f.IncludeClientID != uuid.Nil && bt.ClientID != f.IncludeClientID) ||
					(f.ExcludeUserID != uuid.Nil && bt.UserID == f.ExcludeUserID) ||
					(f.IncludeUserID != uuid.Nil && bt.UserID != f.IncludeUserID) ||
					!in(bt.ServerTimestamp, f.MinServerTimestamp, f.MaxServerTimestamp) {
					continue
				}
				var evs []celeriant.Event
				for _, e := range bt.Events {
					if (len(f.EventTypes) == 0 || slices.Contains(f.EventTypes, e.TypeMajor)) && in(e.ClientSeq, f.MinClientSeq, f.MaxClientSeq) &&
						in(e.Timestamp, f.MinEventTimestamp, f.MaxEventTimestamp) && in(e.EventSeq, f.MinEventSeq, f.MaxEventSeq) {
						evs = append(evs, e)
					}
				}
				if len(evs) > 0 {
					bt.Events = evs
					out = append(out, bt)
				}
			}
			return shape(out)
		}
		u := celeriant.Uint64
		cases := []struct {
			name string
			f    celeriant.ReadFilters
			want string // what the model must say too
		}{
			{"none", celeriant.ReadFilters{}, "v1:12 v2:3 v3:45 v4:6 "},
			{"from", celeriant.ReadFilters{FromVersion: 3}, "v3:45 v4:6 "},
			{"from beyond the tip", celeriant.ReadFilters{FromVersion: 9}, ""},
			{"to", celeriant.ReadFilters{ToVersion: u(2)}, "v1:12 v2:3 "},
			{"from and to", celeriant.ReadFilters{FromVersion: 2, ToVersion: u(3)}, "v2:3 v3:45 "},
			{"to below from", celeriant.ReadFilters{FromVersion: 3, ToVersion: u(2)}, ""},
			{"to beyond the tip", celeriant.ReadFilters{FromVersion: 4, ToVersion: u(99)}, "v4:6 "},
			{"event types", celeriant.ReadFilters{EventTypes: []uint64{1}}, "v1:1 v2:3 v3:5 "},
			{"event types, two", celeriant.ReadFilters{EventTypes: []uint64{2, 3}}, "v1:2 v3:4 v4:6 "},
			{"event types, none match", celeriant.ReadFilters{EventTypes: []uint64{9}}, ""},
			{"exclude client", celeriant.ReadFilters{ExcludeClientID: a}, "v2:3 v4:6 "},
			{"include client", celeriant.ReadFilters{IncludeClientID: a}, "v1:12 v3:45 "},
			{"exclude user", celeriant.ReadFilters{ExcludeUserID: u1}, "v2:3 v3:45 "},
			{"include user", celeriant.ReadFilters{IncludeUserID: u1}, "v1:12 v4:6 "},
			{"min client seq", celeriant.ReadFilters{MinClientSeq: u(2)}, "v1:2 v3:45 v4:6 "},
			{"max client seq", celeriant.ReadFilters{MaxClientSeq: u(1)}, "v1:1 v2:3 "},
			{"one client's seq", celeriant.ReadFilters{IncludeClientID: b, MinClientSeq: u(2), MaxClientSeq: u(2)}, "v4:6 "},
			{"min event time", celeriant.ReadFilters{MinEventTimestamp: u(300)}, "v2:3 v3:45 v4:6 "},
			{"max event time", celeriant.ReadFilters{MaxEventTimestamp: u(400)}, "v1:12 v2:3 v3:4 "},
			{"event time range", celeriant.ReadFilters{MinEventTimestamp: u(200), MaxEventTimestamp: u(200)}, "v1:2 "},
			{"min event seq", celeriant.ReadFilters{MinEventSeq: u(5)}, "v3:5 v4:6 "},
			{"max event seq", celeriant.ReadFilters{MaxEventSeq: u(3)}, "v1:12 v2:3 "},
			{"event seq range", celeriant.ReadFilters{MinEventSeq: u(2), MaxEventSeq: u(4)}, "v1:2 v2:3 v3:4 "},
			{"event and batch filters", celeriant.ReadFilters{FromVersion: 2, ExcludeUserID: u2, EventTypes: []uint64{1, 2}}, "v2:3 v4:6 "},
			// Server timestamps: the expectation comes from the model, since two
			// batches may share a millisecond.
			{"min server time", celeriant.ReadFilters{MinServerTimestamp: ts(3)}, ""},
			{"max server time", celeriant.ReadFilters{MaxServerTimestamp: ts(2)}, ""},
			{"server time range", celeriant.ReadFilters{MinServerTimestamp: ts(2), MaxServerTimestamp: ts(3)}, ""},
		}
		for _, c := range cases {
			want := model(c.f)
			if c.want != "" && want != c.want || c.want == "" && c.f.MinServerTimestamp == nil && c.f.MaxServerTimestamp == nil && want != "" {
				t.Fatalf("%s: the model says %q, the case %q", c.name, want, c.want)
			}
			res, err := s.Read(ctx, celeriant.ReadRequest{Key: key, Filters: c.f})
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if got := shape(res.Batches); got != want || res.NextVersion != 0 {
				t.Errorf("%s: got %q next %d, want %q", c.name, got, res.NextVersion, want)
			}
		}
	})

	t.Run("paging", func(t *testing.T) {
		// Batches of a quarter of the page budget each: a page holds at most four.
		if tg.pageBytes > 4<<20 {
			t.Skipf("a %d-byte page budget needs too much data: set CELERIANT_MAX_RESPONSE_SIZE to a server's smaller --max-response-size", tg.pageBytes)
		}
		key, client := freshKey(), uuid.New()
		size := tg.pageBytes / 4
		const n = 10
		for i := range n {
			w := entry(key, v(uint64(i)), uint64(i+1))
			w.Events[0].Value = bytes.Repeat([]byte{byte('a' + i)}, size)
			if _, err := write(client, w); err != nil {
				t.Fatalf("batch %d: %v", i+1, err)
			}
		}
		var got []uint64
		pages := 0
		for from := uint64(1); from != 0; pages++ {
			res, err := s.Read(ctx, celeriant.ReadRequest{Key: key, Filters: celeriant.ReadFilters{FromVersion: from}})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Batches) == 0 {
				t.Fatalf("page from %d: no batches, next %d", from, res.NextVersion)
			}
			total := 0
			for _, b := range res.Batches {
				total += len(b.Events[0].Value)
				if res.NextVersion != 0 && b.Version >= res.NextVersion {
					continue
				}
				if !bytes.Equal(b.Events[0].Value, bytes.Repeat([]byte{byte('a' + b.Version - 1)}, size)) {
					t.Fatalf("batch %d: wrong payload", b.Version)
				}
				got = append(got, b.Version)
			}
			if total > tg.pageBytes {
				t.Fatalf("page from %d: %d payload bytes, over the %d-byte budget", from, total, tg.pageBytes)
			}
			if res.NextVersion != 0 && res.NextVersion <= from {
				t.Fatalf("page from %d: next %d does not advance", from, res.NextVersion)
			}
			from = res.NextVersion
		}
		if want := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}; !slices.Equal(got, want) || pages < 3 {
			t.Fatalf("versions %v in %d pages, want %v in 3 or more", got, pages, want)
		}
		// A filter that drops batches does not end the paging early.
		odd := readAll(t, key, celeriant.ReadFilters{FromVersion: 1, MinClientSeq: celeriant.Uint64(9)})
		if len(odd) != 2 || odd[0].Version != 9 || odd[1].Version != 10 {
			t.Fatalf("filtered paging: %d batches", len(odd))
		}
	})

	t.Run("batch_over_the_page_budget", func(t *testing.T) {
		// A batch larger than --max-response-size is stored, and every read that starts
		// at it gets no answer: the server fails to write the response, drops it and
		// keeps the connection (docs/celeriant-protocol.md section 6.6). Reads around it
		// still work.
		if tg.pageBytes > 4<<20 {
			t.Skipf("a %d-byte page budget needs too much data", tg.pageBytes)
		}
		key, client := freshKey(), uuid.New()
		for i, n := range []int{100, tg.pageBytes + tg.pageBytes/2, 100} {
			w := entry(key, v(uint64(i)), uint64(i+1))
			w.Events[0].Value = bytes.Repeat([]byte("x"), n)
			if _, err := write(client, w); err != nil {
				t.Fatalf("batch %d: %v", i+1, err)
			}
		}
		res, err := s.Read(ctx, celeriant.ReadRequest{Key: key, Filters: celeriant.ReadFilters{FromVersion: 1}})
		if err != nil || len(res.Batches) != 1 || res.NextVersion != 2 {
			t.Fatalf("from 1: %d batches, next %d, %v; want batch 1 and next 2", len(res.Batches), res.NextVersion, err)
		}
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err = s.Read(rctx, celeriant.ReadRequest{Key: key, Filters: celeriant.ReadFilters{FromVersion: 2}})
		cancel()
		if !errors.Is(err, celeriant.ErrTransport) {
			t.Fatalf("from 2: %v, want no answer (ErrTransport)", err)
		}
		if b := readAll(t, key, celeriant.ReadFilters{FromVersion: 3}); len(b) != 1 || b[0].Version != 3 {
			t.Fatalf("from 3: %d batches", len(b))
		}
		if d := details(t, key); d.MaxVersion != 3 {
			t.Fatalf("details: %+v", d)
		}
	})

	t.Run("trim", func(t *testing.T) {
		key, client := freshKey(), uuid.New()
		for i := range 5 {
			if _, err := write(client, entry(key, v(uint64(i)), uint64(i+1))); err != nil {
				t.Fatal(err)
			}
		}
		if err := tg.trim(ctx, key, 3); err != nil {
			t.Fatalf("trim to 3: %v", err)
		}
		_, err := s.Read(ctx, celeriant.ReadRequest{Key: key, Filters: celeriant.ReadFilters{FromVersion: 1}})
		wantErr(t, "read below the trim point", err, celeriant.CodeReadUnavailableVersion, `{"requested":1,"minimum_available":3}`)
		if m, ok := celeriant.IsUnavailableVersion(err); !ok || m != 3 {
			t.Fatalf("minimum available %d, %v", m, ok)
		}
		if b := readAll(t, key, celeriant.ReadFilters{FromVersion: 3}); len(b) != 3 || b[0].Version != 3 {
			t.Fatalf("from the trim point: %d batches", len(b))
		}
		if d := details(t, key); d.MinVersion != 3 || d.MaxVersion != 5 {
			t.Fatalf("details after trim: %+v", d)
		}
		if err := tg.trim(ctx, key, 2); err != nil {
			t.Fatalf("trim below the minimum: %v", err)
		}
		err = tg.trim(ctx, key, 6)
		wantErr(t, "trim beyond the version", err, celeriant.CodeTrimIndexOutOfRange, `{"requested":6,"max_aggregate_version":5}`)
		err = tg.trim(ctx, freshKey(), 1)
		wantErr(t, "trim of a missing aggregate", err, celeriant.CodeTrimAggregateNotExists, "{}")
		res, err := write(client, entry(key, v(5), 6))
		wantVersion(t, "a write after the trim", res, err, 6) // the version counter is not rewound
		if d := details(t, key); d.MinVersion != 3 || d.MaxVersion != 6 || d.MaxEventSeq != 6 {
			t.Fatalf("details after a write: %+v", d)
		}
	})

	t.Run("watch", func(t *testing.T) {
		key, client := freshKey(), uuid.New()
		_, err := tg.watch.Watch(ctx, celeriant.WatchRequest{Aggregates: []uuid.UUID{key.ID}, RequestedLatencyMs: celeriant.Uint64(999999)})
		wantErr(t, "latency over the maximum", err, celeriant.CodeWatchLatencyTooHigh, `{"requested_ms":999999,"max_ms":2000}`)
		one, err := tg.watch.Watch(ctx, celeriant.WatchRequest{Orgs: []uuid.UUID{key.Org}, Aggregates: []uuid.UUID{key.ID}})
		if err != nil {
			t.Fatal(err)
		}
		defer one.Close()
		// No aggregate: the server refuses (9002 with its shard count), and the client
		// opens one subscription per shard.
		wideReq := celeriant.WatchRequest{Orgs: []uuid.UUID{key.Org}, Operations: []celeriant.WatchOperation{celeriant.WatchWrite}}
		var wide celeriant.WatchStream
		if _, ok := tg.watch.(*celeriant.Client); ok {
			wide, err = tg.watch.Watch(ctx, wideReq)
			if err != nil {
				t.Fatal(err)
			}
			defer wide.Close()
		} else {
			_, err := tg.watch.Watch(ctx, wideReq)
			wantErr(t, "no aggregate in-process", err, celeriant.CodeShardRoutingIncompatible,
				`{"detail":"Must specify at least one aggregate. Server is setup to shard by aggregate.","num_shards":1}`)
		}
		for i := range 2 {
			if _, err := write(client, entry(key, v(uint64(i)), uint64(i+1))); err != nil {
				t.Fatal(err)
			}
		}
		collect := func(st celeriant.WatchStream, n int) []celeriant.WatchEvent {
			var out []celeriant.WatchEvent
			for len(out) < n {
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				res, err := st.Next(wctx)
				cancel()
				if err != nil {
					t.Fatalf("after %v: %v", out, err)
				}
				out = append(out, res.Events...)
			}
			return out
		}
		want := []celeriant.WatchEvent{
			{Key: key, Operation: celeriant.WatchCreate},
			{Key: key, Operation: celeriant.WatchWrite, FromVersion: 1, ToVersion: 1},
			{Key: key, Operation: celeriant.WatchWrite, FromVersion: 2, ToVersion: 2},
		}
		if got := collect(one, 3); !slices.Equal(got, want) {
			t.Fatalf("notifications %+v, want %+v", got, want)
		}
		if wide != nil {
			if got := collect(wide, 2); !slices.Equal(got, want[1:]) {
				t.Fatalf("wide notifications %+v, want %+v", got, want[1:])
			}
		}
		if err := tg.trim(ctx, key, 2); err != nil {
			t.Fatal(err)
		}
		if got := collect(one, 1); !slices.Equal(got, []celeriant.WatchEvent{{Key: key, Operation: celeriant.WatchTrimStart, KeepFromVersion: 2}}) {
			t.Fatalf("after trim: %+v", got)
		}

		// With a requested latency the acknowledgement opens the first window: a write
		// right after it is notified when the window ends, merged with what else came
		// (in no particular order: the server sent the Write before the Create). The
		// window is 1 s so that both writes land in it on a loaded machine, and the
		// first frame must come no sooner than half of it (both bounds leave 0.5 s
		// of slack for scheduling and the acknowledgement's trip).
		fresh := freshKey()
		slow, err := tg.watch.Watch(ctx, celeriant.WatchRequest{Aggregates: []uuid.UUID{fresh.ID}, RequestedLatencyMs: celeriant.Uint64(1000)})
		if err != nil {
			t.Fatal(err)
		}
		defer slow.Close()
		acked := time.Now()
		for i := range 2 {
			if _, err := write(client, entry(fresh, v(uint64(i)), uint64(i+1))); err != nil {
				t.Fatal(err)
			}
		}
		res, err := slow.Next(ctx)
		if waited := time.Since(acked); err != nil || waited < 500*time.Millisecond {
			t.Fatalf("first frame after %v: %+v, %v; want one at the end of the 1 s window", waited, res, err)
		}
		got := map[celeriant.WatchEvent]bool{}
		for _, e := range res.Events {
			got[e] = true
		}
		if len(res.Events) != 2 || !got[celeriant.WatchEvent{Key: fresh, Operation: celeriant.WatchCreate}] ||
			!got[celeriant.WatchEvent{Key: fresh, Operation: celeriant.WatchWrite, FromVersion: 1, ToVersion: 2}] {
			t.Fatalf("merged frame %+v, want Create and Write 1-2", res.Events)
		}
	})
}

// trimOverWire sends a TrimStart request (message type 4, docs/celeriant-protocol.md
// section 4.1: [correlation id, key, keep from version, client id, user id]) on a
// connection of its own and returns nil for a TrimStartResponse or the
// *celeriant.ServerError of an ErrorResponse. The client does not send TrimStart; the
// rules suite needs it to make ranges unavailable on a real server.
func trimOverWire(addr string) func(ctx context.Context, key celeriant.AggregateKey, keepFrom uint64) error {
	return func(ctx context.Context, key celeriant.AggregateKey, keepFrom uint64) error {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer nc.Close()
		if dl, ok := ctx.Deadline(); ok {
			_ = nc.SetDeadline(dl)
		}
		id := func(b []byte, u uuid.UUID) []byte { return append(append(b, 0xc4, 0x10), u[:]...) }
		body := []byte{0x95}
		body = id(body, uuid.New())
		body = append(body, 0x93)
		body = id(id(id(body, key.Org), key.Type), key.ID)
		body = append(body, 0xcf)
		body = binary.BigEndian.AppendUint64(body, keepFrom)
		body = id(body, uuid.New())
		body = append(body, 0xc0)
		frame := binary.LittleEndian.AppendUint32(nil, 3)
		frame = binary.LittleEndian.AppendUint32(frame, 4)
		frame = binary.LittleEndian.AppendUint32(frame, uint32(len(body)))
		frame = binary.LittleEndian.AppendUint32(frame, uint32(len(body)))
		frame = append(append(frame, 0), body...)
		if _, err := nc.Write(frame); err != nil {
			return err
		}
		var h [17]byte
		if _, err := io.ReadFull(nc, h[:]); err != nil {
			return fmt.Errorf("trim: reading the answer: %w", err)
		}
		resp := make([]byte, binary.LittleEndian.Uint32(h[8:12]))
		if _, err := io.ReadFull(nc, resp); err != nil {
			return fmt.Errorf("trim: reading the answer: %w", err)
		}
		switch typ := binary.LittleEndian.Uint32(h[4:8]); typ {
		case 4:
			return nil
		case 7:
			return decodeErrorBody(resp)
		default:
			return fmt.Errorf("trim: answer of type %d", typ)
		}
	}
}

// decodeErrorBody decodes an ErrorResponse body [correlation id, code, message] of the
// forms the server writes (a bin8 id or nil, a minimal unsigned integer, a str).
func decodeErrorBody(b []byte) error {
	bad := fmt.Errorf("trim: undecodable error answer % x", b)
	if len(b) < 2 || b[0] != 0x93 {
		return bad
	}
	b = b[1:]
	switch {
	case b[0] == 0xc0:
		b = b[1:]
	case len(b) >= 18 && b[0] == 0xc4 && b[1] == 0x10:
		b = b[18:]
	default:
		return bad
	}
	var code uint64
	switch {
	case len(b) >= 1 && b[0] <= 0x7f:
		code, b = uint64(b[0]), b[1:]
	case len(b) >= 3 && b[0] == 0xcd:
		code, b = uint64(binary.BigEndian.Uint16(b[1:3])), b[3:]
	case len(b) >= 5 && b[0] == 0xce:
		code, b = uint64(binary.BigEndian.Uint32(b[1:5])), b[5:]
	default:
		return bad
	}
	var msg []byte
	switch {
	case len(b) >= 1 && b[0]&0xe0 == 0xa0:
		msg = b[1:]
	case len(b) >= 2 && b[0] == 0xd9:
		msg = b[2:]
	case len(b) >= 3 && b[0] == 0xda:
		msg = b[3:]
	default:
		return bad
	}
	return celeriant.NewServerError(celeriant.Code(code), string(msg))
}

// TestShardRules: on a server with two shards (by aggregate id, read as a big-endian
// 128-bit integer, modulo the shard count), a write across shards is 9001 and writes
// nothing, a write within one shard commits, and a watch must name aggregates of one
// shard (9001/9002 with num_shards) unless the client opens one per shard. Against the
// simulator with Options.Shards 2, and against CELERIANT_SHARDED_ADDR, a real server
// started with --num-shards 2, when it is set.
func TestShardRules(t *testing.T) {
	type target struct {
		s celeriant.EventStore
		w celeriant.Watcher
	}
	targets := map[string]target{}
	inproc := celeriantsim.New(celeriantsim.Options{Shards: 2})
	t.Cleanup(func() { _ = inproc.Close() })
	targets["sim-inprocess"] = target{inproc, inproc}
	_, addr := startSim(t, celeriantsim.Options{Shards: 2})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	targets["client-tcp-sim"] = target{c, c}
	if live := os.Getenv("CELERIANT_SHARDED_ADDR"); live != "" {
		lc := newClient(t, celeriant.Config{Addrs: []string{live}})
		targets["live"] = target{lc, lc}
	}
	for name, tg := range targets {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			onShard := func(shard byte) celeriant.AggregateKey {
				for {
					if k := freshKey(); k.ID[15]%2 == shard { // id mod 2 is the last byte's parity
						return k
					}
				}
			}
			p, q, r := onShard(0), onShard(1), onShard(0)
			q.Org, r.Org = p.Org, p.Org
			client := uuid.New()
			w := func(k celeriant.AggregateKey) celeriant.AggregateWrite {
				return celeriant.AggregateWrite{Key: k, AllowCreate: true, ExpectedVersion: celeriant.Version(0), EnforceClientIdempotency: true,
					Events: []celeriant.Event{{ClientSeq: 1, TypeMajor: 1, Value: []byte("{}")}}}
			}
			_, err := tg.s.Write(ctx, celeriant.WriteRequest{ClientID: client, Writes: []celeriant.AggregateWrite{w(p), w(q)}})
			var se *celeriant.ServerError
			if !errors.As(err, &se) || se.Code != celeriant.CodeShardRoutingMultipleShards || se.Message != `{"num_shards":2}` {
				t.Fatalf("across shards: %v", err)
			}
			for _, k := range []celeriant.AggregateKey{p, q} {
				if _, err := tg.s.AggregateDetails(ctx, k); !celeriant.IsNotFound(err) {
					t.Fatalf("%s after the refused write: %v", k, err)
				}
			}
			if _, err := tg.s.Write(ctx, celeriant.WriteRequest{ClientID: client, Writes: []celeriant.AggregateWrite{w(p), w(r)}}); err != nil {
				t.Fatalf("within shard 0: %v", err)
			}
			_, err = tg.w.Watch(ctx, celeriant.WatchRequest{Aggregates: []uuid.UUID{p.ID, q.ID}, ShardID: celeriant.Uint64(5)})
			if !errors.As(err, &se) || se.Code != celeriant.CodeShardRoutingIncompatible || se.NumShards != 2 {
				t.Fatalf("watch of shard 5: %v", err)
			}
			if _, ok := tg.w.(*celeriant.Client); !ok {
				_, err = tg.w.Watch(ctx, celeriant.WatchRequest{Aggregates: []uuid.UUID{p.ID, q.ID}})
				if !errors.As(err, &se) || se.Code != celeriant.CodeShardRoutingMultipleShards || se.Message != `{"num_shards":2}` {
					t.Fatalf("watch across shards in-process: %v", err)
				}
				return
			}
			st, err := tg.w.Watch(ctx, celeriant.WatchRequest{Orgs: []uuid.UUID{p.Org}, Operations: []celeriant.WatchOperation{celeriant.WatchWrite}})
			if err != nil {
				t.Fatalf("watch of an org: %v", err)
			}
			defer st.Close()
			seen := map[celeriant.AggregateKey]bool{}
			for _, k := range []celeriant.AggregateKey{p, q} {
				ww := w(k)
				ww.ExpectedVersion = nil
				ww.Events[0].ClientSeq = 2
				if _, err := tg.s.Write(ctx, celeriant.WriteRequest{ClientID: client, Writes: []celeriant.AggregateWrite{ww}}); err != nil {
					t.Fatal(err)
				}
				for { // skip heartbeats (empty frames after 5 s of silence)
					res, err := st.Next(ctx)
					if err != nil {
						t.Fatal(err)
					}
					for _, e := range res.Events {
						seen[e.Key] = true
					}
					if len(res.Events) > 0 {
						break
					}
				}
			}
			if !seen[p] || !seen[q] {
				t.Fatalf("notifications of %v, want both shards' aggregates", seen)
			}
		})
	}
}
