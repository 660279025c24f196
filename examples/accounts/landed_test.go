package accounts

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/internal/testclock"
)

// ageOut makes the dedup index forget eventID as if its window had passed: the memory
// projection runs on the test clock (already advanced), the Postgres one on the
// database clock, so its rows are expired explicitly.
func ageOut(t *testing.T, p *pod, eventID uuid.UUID) {
	t.Helper()
	if pg, ok := p.proj.(*PostgresProjection); ok {
		_, responses, _ := pg.Tables()
		if _, err := pg.pool.Exec(context.Background(),
			"UPDATE "+responses+" SET expires_at = now() - interval '1 second' WHERE event_id = $1", eventID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLateRetryAfterTakeover: a request landed, its answer never reached the client (the
// replica died), the index forgot it (past the window) and other requests folded past
// it. The retry arrives after the middleware's takeover, marked MayHaveLanded: the
// service finds its event in the stream, answers the original result and writes
// nothing. Without the search it would write a second event.
func TestLateRetryAfterTakeover(t *testing.T) {
	ctx := context.Background()
	forEachKind(t, func(t *testing.T, mk func(t *testing.T, clock *testclock.Clock, window time.Duration) Projection) {
		t.Run("deposit", func(t *testing.T) {
			e := newEnv(t, mk)
			podA, podB := e.pod(DefaultWindow), e.pod(DefaultWindow)
			acct := uuid.New()
			if _, err := podA.Deposit(ctx, acct, 25_000, NewEventID()); err != nil {
				t.Fatal(err)
			}
			x := EventIDFor("tenant", "K", Operation("deposit", 222, acct))
			first, err := podA.Deposit(ctx, acct, 222, x) // lands; the client never sees it
			if err != nil || first != (Result{25_222, 2}) {
				t.Fatalf("first: %+v, %v", first, err)
			}
			e.clock.Add(DefaultWindow + 5*time.Second)
			ageOut(t, podA, x)
			if _, err := podB.Deposit(ctx, acct, 5, NewEventID()); err != nil { // folds past x
				t.Fatal(err)
			}
			if _, err := podA.Deposit(ctx, acct, 7, NewEventID()); err != nil { // and on podA too
				t.Fatal(err)
			}
			for _, p := range []*pod{podB, podA} {
				got, err := p.Deposit(MayHaveLanded(ctx), acct, 222, x)
				if err != nil || got != first {
					t.Fatalf("late retry: %+v, %v; want the original %+v", got, err, first)
				}
			}
			if n := e.countID(acct, x); n != 1 {
				t.Fatalf("%d events with the request's EventId, want 1", n)
			}
			if r, err := podB.Balance(ctx, acct, 0); err != nil || r.BalanceCents != 25_234 {
				t.Fatalf("balance %+v, %v; want 25234", r, err)
			}
		})
		t.Run("transfer", func(t *testing.T) {
			e := newEnv(t, mk)
			podA, podB := e.pod(DefaultWindow), e.pod(DefaultWindow)
			from, to := uuid.New(), uuid.New()
			if _, err := podA.Deposit(ctx, from, 1_000, NewEventID()); err != nil {
				t.Fatal(err)
			}
			x := EventIDFor("tenant", "T", Operation("transfer", 300, from, to))
			first, err := podA.Transfer(ctx, from, to, 300, x)
			if err != nil || first != (TransferResult{From: Result{700, 2}, To: Result{300, 1}}) {
				t.Fatalf("first: %+v, %v", first, err)
			}
			e.clock.Add(DefaultWindow + 5*time.Second)
			ageOut(t, podA, x)
			if _, err := podB.Deposit(ctx, from, 5, NewEventID()); err != nil {
				t.Fatal(err)
			}
			if _, err := podB.Deposit(ctx, to, 9, NewEventID()); err != nil {
				t.Fatal(err)
			}
			got, err := podB.Transfer(MayHaveLanded(ctx), from, to, 300, x)
			if err != nil || got != first {
				t.Fatalf("late retry: %+v, %v; want the original %+v", got, err, first)
			}
			if n, m := e.countID(from, x), e.countID(to, x); n != 1 || m != 1 {
				t.Fatalf("%d/%d events with the request's EventId, want 1/1", n, m)
			}
		})
		t.Run("not landed writes once", func(t *testing.T) {
			e := newEnv(t, mk)
			p := e.pod(DefaultWindow)
			acct := uuid.New()
			x := EventIDFor("tenant", "N", Operation("deposit", 40, acct))
			got, err := p.Deposit(MayHaveLanded(ctx), acct, 40, x)
			if err != nil || got != (Result{40, 1}) || e.countID(acct, x) != 1 {
				t.Fatalf("got %+v, %v; %d events", got, err, e.countID(acct, x))
			}
		})
	})
}

// TestKeyReusedForAnotherOperation covers the cases where the middleware
// forgot a key (a lost Redis record, a retention shorter than the dedup window) and the
// key comes back with another operation: it executes (or is refused on its own merits)
// instead of being answered with the first operation's result, and a retry of the same
// operation is still found.
func TestKeyReusedForAnotherOperation(t *testing.T) {
	ctx := context.Background()
	forEachKind(t, func(t *testing.T, mk func(t *testing.T, clock *testclock.Clock, window time.Duration) Projection) {
		e := newEnv(t, mk)
		p := e.pod(DefaultWindow)
		acct, other := uuid.New(), uuid.New()
		id := func(op string) uuid.UUID { return EventIDFor("tenant", "K", op) }

		dep, err := p.Deposit(ctx, acct, 100, id(Operation("deposit", 100, acct)))
		if err != nil || dep != (Result{100, 1}) {
			t.Fatalf("deposit: %+v, %v", dep, err)
		}
		// Transfer 20000 with the same key: refused on its own merits, not answered 200.
		if _, err := p.Transfer(ctx, acct, other, 20_000, id(Operation("transfer", 20_000, acct, other))); !errors.Is(err, ErrInsufficientFunds) {
			t.Fatalf("transfer over the balance: %v, want insufficient funds", err)
		}
		// Withdraw 50 with the same key: executes.
		w, err := p.Withdraw(ctx, acct, 50, id(Operation("withdraw", 50, acct)))
		if err != nil || w != (Result{50, 2}) {
			t.Fatalf("withdraw: %+v, %v; want it executed", w, err)
		}
		// A transfer that fits: executes, both legs written.
		tr, err := p.Transfer(ctx, acct, other, 20, id(Operation("transfer", 20, acct, other)))
		if err != nil || tr != (TransferResult{From: Result{30, 3}, To: Result{20, 1}}) {
			t.Fatalf("transfer: %+v, %v", tr, err)
		}
		// A retry of the first operation is still found and writes nothing.
		again, err := p.Deposit(ctx, acct, 100, id(Operation("deposit", 100, acct)))
		if err != nil || again != dep {
			t.Fatalf("deposit retry: %+v, %v; want %+v", again, err, dep)
		}
		if n := len(e.events(acct)); n != 3 {
			t.Fatalf("%d events on the account, want 3", n)
		}
	})
}
