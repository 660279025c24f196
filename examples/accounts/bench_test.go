package accounts

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/internal/testclock"
)

// countingStore counts event-store round trips.
type roundTrips struct{ reads, writes int }

func (e *env) roundTrips() roundTrips {
	s := e.sim.Stats()
	return roundTrips{reads: s.Reads, writes: s.Writes}
}

// TestRoundTrips pins the Celeriant round trips of the hot paths: a first write on a warm
// replica costs one read (catch-up) and one write; a retry answered by the index costs
// none; a retry on the other replica costs one read.
func TestRoundTrips(t *testing.T) {
	forEachKind(t, func(t *testing.T, mk func(*testing.T, *testclock.Clock, time.Duration) Projection) {
		ctx := context.Background()
		e := newEnv(t, mk)
		podA, podB := e.pod(0), e.pod(0)
		acct := acctID("round-trips")
		if _, err := podA.Deposit(ctx, acct, 1, uuid.Nil); err != nil {
			t.Fatal(err)
		}
		step := func(name string, want roundTrips, f func() error) {
			t.Helper()
			before := e.roundTrips()
			if err := f(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			after := e.roundTrips()
			if got := (roundTrips{after.reads - before.reads, after.writes - before.writes}); got != want {
				t.Errorf("%s: %+v round trips, want %+v", name, got, want)
			}
		}
		x := eid("round-trips", 1)
		step("first write", roundTrips{1, 1}, func() error { _, err := podA.Deposit(ctx, acct, 5, x); return err })
		step("same-replica retry", roundTrips{0, 0}, func() error { _, err := podA.Deposit(ctx, acct, 5, x); return err })
		want := roundTrips{1, 0}
		if _, ok := podB.proj.(*PostgresProjection); ok {
			want = roundTrips{0, 0} // the shared index answers first
		}
		step("cross-replica retry", want, func() error { _, err := podB.Deposit(ctx, acct, 5, x); return err })
	})
}

func benchService(b *testing.B, proj Projection) (*Service, uuid.UUID) {
	b.Helper()
	svc, err := New(celeriantsim.New(celeriantsim.Options{}), proj, WithSleep(func(context.Context, time.Duration) error { return nil }))
	if err != nil {
		b.Fatal(err)
	}
	return svc, uuid.New()
}

// BenchmarkDeposit measures a first write (fresh EventId: catch-up, write, record) and a
// replay (same EventId, answered by the index), for both projections.
func BenchmarkDeposit(b *testing.B) {
	ctx := context.Background()
	projections := map[string]func(b *testing.B) Projection{
		"memory": func(*testing.B) Projection { return NewMemoryProjection() },
		"postgres": func(b *testing.B) Projection {
			return newPGProjections(b)(b, nil, 0)
		},
	}
	for _, name := range []string{"memory", "postgres"} {
		b.Run(name+"/first", func(b *testing.B) {
			svc, acct := benchService(b, projections[name](b))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := svc.Deposit(ctx, acct, 1, NewEventID()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/replay", func(b *testing.B) {
			svc, acct := benchService(b, projections[name](b))
			x := NewEventID()
			if _, err := svc.Deposit(ctx, acct, 1, x); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := svc.Deposit(ctx, acct, 1, x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
