package accounts

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/internal/testclock"
)

var precisions = []celeriant.Precision{celeriant.Milliseconds, celeriant.Microseconds, celeriant.Nanoseconds}

// TestLateRetryAtEachPrecision runs the late retry of TestLateRetryAfterTakeover and a
// retry answered from the dedup index of another replica's fold on servers stamping
// batches in milliseconds, microseconds and nanoseconds (docs/celeriant-protocol.md
// section 6.8). Server time read as milliseconds would shrink the landed lookback and
// the dedup window 1000 or a million times: the late retry would miss its event and
// deposit a second time, and so would the retry within the window.
func TestLateRetryAtEachPrecision(t *testing.T) {
	ctx := context.Background()
	for _, p := range precisions {
		t.Run(p.String(), func(t *testing.T) {
			forEachKind(t, func(t *testing.T, mk func(t *testing.T, clock *testclock.Clock, window time.Duration) Projection) {
				t.Run("late retry", func(t *testing.T) {
					e := newEnvAt(t, mk, p)
					podA, podB := e.pod(DefaultWindow), e.pod(DefaultWindow)
					acct := uuid.New()
					if _, err := podA.Deposit(ctx, acct, 1_000, NewEventID()); err != nil {
						t.Fatal(err)
					}
					x := EventIDFor("tenant", "K", Operation("deposit", 222, acct))
					first, err := podA.Deposit(ctx, acct, 222, x) // lands; the client never sees it
					if err != nil {
						t.Fatal(err)
					}
					e.clock.Add(DefaultWindow + 5*time.Second) // past the window, within the lookback
					ageOut(t, podA, x)
					if _, err := podB.Deposit(ctx, acct, 5, NewEventID()); err != nil {
						t.Fatal(err)
					}
					if _, err := podA.Deposit(ctx, acct, 7, NewEventID()); err != nil { // podA folds past x: too old to index
						t.Fatal(err)
					}
					// podA's index forgot x, so only the search of the stream finds it.
					if got, err := podA.Deposit(MayHaveLanded(ctx), acct, 222, x); err != nil || got != first {
						t.Fatalf("late retry: %+v, %v; want the original %+v", got, err, first)
					}
					if n := e.countID(acct, x); n != 1 {
						t.Fatalf("%d events with the request's EventId, want 1", n)
					}
				})
				t.Run("within the window", func(t *testing.T) {
					e := newEnvAt(t, mk, p)
					podA, podB := e.pod(DefaultWindow), e.pod(DefaultWindow)
					acct := uuid.New()
					x := EventIDFor("tenant", "W", Operation("deposit", 40, acct))
					first, err := podA.Deposit(ctx, acct, 40, x)
					if err != nil {
						t.Fatal(err)
					}
					e.clock.Add(DefaultWindow / 2)
					if _, err := podA.Deposit(ctx, acct, 2, NewEventID()); err != nil { // a newer batch: x is 45 s old
						t.Fatal(err)
					}
					// podB folds both batches and must index x with 45 s left.
					if got, err := podB.Deposit(ctx, acct, 40, x); err != nil || got != first {
						t.Fatalf("retry within the window: %+v, %v; want the original %+v", got, err, first)
					}
					if n := e.countID(acct, x); n != 1 {
						t.Fatalf("%d events with the request's EventId, want 1", n)
					}
				})
			})
		})
	}
}

// TestSeedRefusesPrecisionMismatch: a service configured for one precision refuses,
// at Seed, a server that stamps in another (the protocol does not tell the client, so
// this check is what stops a misconfigured service from starting); a matching one
// seeds.
func TestSeedRefusesPrecisionMismatch(t *testing.T) {
	ctx := context.Background()
	for _, server := range precisions {
		for _, configured := range precisions {
			sim := celeriantsim.New(celeriantsim.Options{Precision: server})
			svc, err := New(sim, NewMemoryProjection(), WithTimestampPrecision(configured), WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			err = svc.Seed(ctx)
			if mismatch := errors.Is(err, celeriant.ErrPrecisionMismatch); mismatch != (server != configured) || (err != nil && !mismatch) {
				t.Errorf("server %s, configured %s: Seed = %v", server, configured, err)
			}
			_ = sim.Close()
		}
	}
}
