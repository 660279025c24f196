package writeloop_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/writeloop"
)

// scripted is an Attempt whose writes and verdicts come from a script; it records the
// reDerive flag Prepare saw on each attempt.
type scripted struct {
	writes   []error
	verdicts []writeloop.Verdict
	doneAt   int // attempt at which Prepare reports done (0: never)
	reDerive []bool
}

func (s *scripted) Prepare(_ context.Context, attempt int, reDerive bool) (bool, error) {
	s.reDerive = append(s.reDerive, reDerive)
	return attempt == s.doneAt, nil
}

func (s *scripted) Write(context.Context) error {
	err := s.writes[0]
	s.writes = s.writes[1:]
	return err
}

func (s *scripted) Owner(context.Context) (writeloop.Verdict, error) {
	v := s.verdicts[0]
	s.verdicts = s.verdicts[1:]
	return v, nil
}

func TestRunArms(t *testing.T) {
	occ := celeriant.NewServerError(celeriant.CodeWriteOCC, "{}")
	dup := celeriant.NewServerError(celeriant.CodeWriteClientIdempotency, "{}")
	inflight := celeriant.NewServerError(celeriant.CodeWriteInflightDuplicate, "{}")
	fatal := celeriant.NewServerError(celeriant.Code(9002), "{}")
	business := errors.New("insufficient funds")
	tests := []struct {
		name     string
		s        scripted
		want     writeloop.Outcome
		wantErr  error
		reDerive []bool
		waits    []time.Duration
	}{
		{"success", scripted{writes: []error{nil}}, writeloop.Written, nil, []bool{true}, nil},
		{"2003 re-derives", scripted{writes: []error{occ, nil}}, writeloop.Written, nil, []bool{true, true}, []time.Duration{200 * time.Millisecond}},
		{"ambiguous holds", scripted{writes: []error{celeriant.ErrOutcomeUnknown, inflight, nil}}, writeloop.Written, nil, []bool{true, false, false}, []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}},
		{"2002 ours", scripted{writes: []error{dup}, verdicts: []writeloop.Verdict{writeloop.Ours}}, writeloop.Owned, nil, []bool{true}, nil},
		{"2002 sibling re-derives", scripted{writes: []error{dup, nil}, verdicts: []writeloop.Verdict{writeloop.Sibling}}, writeloop.Written, nil, []bool{true, true}, []time.Duration{200 * time.Millisecond}},
		{"2002 unwritten", scripted{writes: []error{dup}, verdicts: []writeloop.Verdict{writeloop.Unwritten}}, 0, writeloop.ErrUnverifiable, []bool{true}, nil},
		{"found on retry", scripted{writes: []error{celeriant.ErrOutcomeUnknown}, doneAt: 2}, writeloop.Found, nil, []bool{true, false}, []time.Duration{200 * time.Millisecond}},
		{"exhausted", scripted{writes: []error{occ, occ, occ}}, 0, writeloop.ErrExhausted, []bool{true, true, true}, []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}},
		{"fatal", scripted{writes: []error{fatal}}, 0, fatal, []bool{true}, nil},
		{"business rule", scripted{writes: []error{business}}, 0, business, []bool{true}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var waits []time.Duration
			loop := writeloop.Loop{Backoff: writeloop.Backoff{
				Jitter: -1,
				Sleep:  func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil },
			}}
			s := tt.s
			got, err := loop.Run(context.Background(), &s)
			if got != tt.want || !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("Run = %v, %v; want %v, %v", got, err, tt.want, tt.wantErr)
			}
			if fmt.Sprint(s.reDerive) != fmt.Sprint(tt.reDerive) || fmt.Sprint(waits) != fmt.Sprint(tt.waits) {
				t.Fatalf("reDerive %v waits %v; want %v %v", s.reDerive, waits, tt.reDerive, tt.waits)
			}
		})
	}
}

func TestBackoffDelay(t *testing.T) {
	b := writeloop.Backoff{Rand: func(n int64) int64 { return n - 1 }}
	for attempt, want := range map[int]time.Duration{1: 0, 2: 200*time.Millisecond + 50*time.Millisecond - 1, 3: 400*time.Millisecond + 50*time.Millisecond - 1} {
		if got := b.Delay(attempt); got != want {
			t.Errorf("Delay(%d) = %v, want %v", attempt, got, want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (writeloop.Backoff{Base: time.Hour}).Wait(ctx, 2); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on a done context = %v", err)
	}
}

func TestEventID(t *testing.T) {
	ns := uuid.MustParse("4c57ce62-0a44-5495-90e5-e0a0e2a33a5b")
	a := writeloop.EventID(ns, "ab", "c", "op")
	if a.Version() != 5 || a.Variant() != uuid.RFC4122 {
		t.Fatalf("EventID %s: version %d variant %v", a, a.Version(), a.Variant())
	}
	for _, other := range [][]string{{"a", "bc", "op"}, {"ab", "c", "op2"}, {"ab", "c"}, {"ab", "cop"}} {
		if writeloop.EventID(ns, other...) == a {
			t.Errorf("EventID%q collides with (ab, c, op)", other)
		}
	}
	if writeloop.EventID(ns, "ab", "c", "op") != a {
		t.Fatal("EventID is not deterministic")
	}
}

// TestFindEvent: the search sees an event within lookback of the newest batch in server
// time, not one older, and only among the client id's batches, at each timestamp
// precision of the server (lookback read as milliseconds on a micro- or nanosecond
// server would reach back 1000 times less).
func TestFindEvent(t *testing.T) {
	for _, p := range []celeriant.Precision{celeriant.Milliseconds, celeriant.Microseconds, celeriant.Nanoseconds} {
		t.Run(p.String(), func(t *testing.T) { testFindEvent(t, p) })
	}
}

func testFindEvent(t *testing.T, p celeriant.Precision) {
	now := time.UnixMilli(1_700_000_000_000)
	sim := celeriantsim.New(celeriantsim.Options{Now: func() time.Time { return now }, Precision: p})
	defer sim.Close()
	ctx := context.Background()
	key := celeriant.AggregateKey{Org: uuid.New(), Type: uuid.New(), ID: uuid.New()}
	me, other := uuid.New(), uuid.New()
	old, recent, foreign := uuid.New(), uuid.New(), uuid.New()
	write := func(client, event uuid.UUID, seq uint64) {
		t.Helper()
		if _, err := sim.Write(ctx, celeriant.WriteRequest{ClientID: client, Writes: []celeriant.AggregateWrite{{Key: key, AllowCreate: true,
			Events: []celeriant.Event{{ClientSeq: seq, EventID: event, TypeMajor: 1}}}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, found, err := writeloop.FindEvent(ctx, sim, key, me, old, time.Hour, p); found || err != nil {
		t.Fatalf("missing aggregate: found %v err %v", found, err)
	}
	write(me, old, 1)
	now = now.Add(2 * time.Hour)
	write(me, recent, 2)
	write(other, foreign, 1)
	for _, tt := range []struct {
		event    uuid.UUID
		lookback time.Duration
		version  uint64
		found    bool
	}{{recent, time.Hour, 2, true}, {old, time.Hour, 0, false}, {old, 3 * time.Hour, 1, true}, {foreign, time.Hour, 0, false}} {
		v, found, err := writeloop.FindEvent(ctx, sim, key, me, tt.event, tt.lookback, p)
		if err != nil || found != tt.found || v != tt.version {
			t.Errorf("FindEvent(%s, %v) = %d, %v, %v; want %d, %v", tt.event, tt.lookback, v, found, err, tt.version, tt.found)
		}
	}
}
