package accounts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/internal/testclock"
)

// setup returns an env with replica pod_a and an account holding one deposit of 100 at
// version 1, ClientSeq 1.
func setup(t *testing.T, mk func(*testing.T, *testclock.Clock, time.Duration) Projection, name string, opts ...Option) (*env, *pod, uuid.UUID) {
	t.Helper()
	e := newEnv(t, mk)
	podA := e.pod(0, opts...)
	acct := acctID(name)
	if r, err := podA.Deposit(context.Background(), acct, 100, eid(name, 0)); err != nil || r != (Result{100, 1}) {
		t.Fatalf("setup deposit: %+v, %v", r, err)
	}
	return e, podA, acct
}

// expireIndex ends the dedup window of every index entry: the memory projections run on
// the fake clock (advanced by the caller); Postgres rows get an expiry in the past.
func expireIndex(t *testing.T, p Projection) {
	t.Helper()
	pg, ok := p.(*PostgresProjection)
	if !ok {
		return
	}
	_, resp, _ := pg.Tables()
	if _, err := pg.pool.Exec(context.Background(), "UPDATE "+resp+" SET expires_at = now() - interval '1 millisecond'"); err != nil {
		t.Fatal(err)
	}
}

// deleteIndexRow removes the index entry of (eventID, acct).
func deleteIndexRow(t *testing.T, p Projection, acct, eventID uuid.UUID) {
	t.Helper()
	switch p := p.(type) {
	case *PostgresProjection:
		_, resp, _ := p.Tables()
		if _, err := p.pool.Exec(context.Background(), "DELETE FROM "+resp+" WHERE aggregate_id = $1 AND event_id = $2", pgUUID(acct), pgUUID(eventID)); err != nil {
			t.Fatal(err)
		}
	case *MemoryProjection:
		p.mu.Lock()
		delete(p.accounts[acct].recent, eventID)
		p.mu.Unlock()
	}
}

// failRecord is a projection whose recordWrite always fails (fault g).
type failRecord struct{ Projection }

func (failRecord) recordWrite(context.Context, uuid.UUID, uuid.UUID, Result, uint64, uint64) error {
	return errors.New("injected: projection write failed")
}

// TestFaults covers the acceptance tests (a)-(k) of docs/account-service.md section 5.4 with the
// simulator's fault injection, for both projections.
func TestFaults(t *testing.T) {
	ctx := context.Background()
	forEachKind(t, func(t *testing.T, mk func(*testing.T, *testclock.Clock, time.Duration) Projection) {
		// (a) The write commits, the answer is lost; by the retry the event has left the
		// window (a foreign writer's batch 91 s later is the tip), so catch-up advances the
		// version without an index hit. The held seq with the fresh version gets 2002, the
		// point read says Ours: 200 with the original balance, one event, no second write.
		t.Run("a_lost_answer_then_2002_ours", func(t *testing.T) {
			for _, trimmed := range []bool{false, true} {
				name := fmt.Sprintf("fault-a-%v", trimmed) // Postgres tables are shared per kind
				e, podA, acct := setup(t, mk, name)
				x := eid(name, 1)
				e.sim.LoseNextWriteAnswer()
				podA.store.afterWrite = func(n int, err error) {
					if n == 2 {
						e.clock.Add(DefaultWindow + time.Second)
						e.foreignWrite(acct)
						if trimmed { // the ownership read from 1 gets 1000 and re-reads from 2
							if err := e.sim.Trim(Key(acct), 2); err != nil {
								t.Error(err)
							}
						}
					}
				}
				r, err := podA.Deposit(ctx, acct, 50, x)
				if err != nil || r.BalanceCents != 150 {
					t.Fatalf("trimmed=%v: got %+v, %v; want balance 150", trimmed, r, err)
				}
				if r.AggregateVersion != 3 { // Ours without a hit answers the current state
					t.Errorf("trimmed=%v: version %d, want 3 (current state)", trimmed, r.AggregateVersion)
				}
				if n := e.countID(acct, x); n != 1 {
					t.Errorf("trimmed=%v: EventId written %d times", trimmed, n)
				}
				if podA.store.writes != 3 {
					t.Errorf("trimmed=%v: %d writes, want 3 (setup, lost, 2002)", trimmed, podA.store.writes)
				}
			}
		})

		// (b) The same lost answer, but the catch-up's index answers first.
		t.Run("b_lost_answer_then_index_hit", func(t *testing.T) {
			e, podA, acct := setup(t, mk, "fault-b")
			x := eid("fault-b", 1)
			e.sim.LoseNextWriteAnswer()
			r, err := podA.Deposit(ctx, acct, 50, x)
			if err != nil || r != (Result{150, 2}) {
				t.Fatalf("got %+v, %v; want {150, 2}", r, err)
			}
			if podA.store.writes != 2 || e.countID(acct, x) != 1 || len(e.events(acct)) != 2 {
				t.Errorf("writes %d, events %d: want 2 writes and the event once", podA.store.writes, len(e.events(acct)))
			}
		})

		// (c) Sibling B derives the seq A takes; B's 2003 is lost, so B holds the seq, gets
		// 2002 about A's event, the point read says Sibling, and B re-derives.
		t.Run("c_lost_2003_then_sibling", func(t *testing.T) {
			e, podA, acct := setup(t, mk, "fault-c")
			podB := e.pod(0)
			xa, xb := eid("fault-c", 1), eid("fault-c", 2)
			podB.store.beforeWrite = func(n int) {
				if n == 1 {
					if r, err := podA.Deposit(ctx, acct, 10, xa); err != nil || r != (Result{110, 2}) {
						t.Errorf("pod_a: %+v, %v", r, err)
					}
					e.sim.LoseNextWriteAnswer()
				}
			}
			r, err := podB.Deposit(ctx, acct, 20, xb)
			if err != nil || r != (Result{130, 3}) {
				t.Fatalf("pod_b: %+v, %v; want {130, 3}", r, err)
			}
			if e.countID(acct, xa) != 1 || e.countID(acct, xb) != 1 || len(e.events(acct)) != 3 {
				t.Errorf("each EventId must land exactly once; log has %d events", len(e.events(acct)))
			}
			if podB.store.writes != 3 || len(podB.sleeps.Sleeps()) != 2 {
				t.Errorf("pod_b: %d writes, %d backoffs; want 3 and 2", podB.store.writes, len(podB.sleeps.Sleeps()))
			}
			if seq := e.events(acct)[2].ClientSeq; seq != 3 {
				t.Errorf("re-derived seq %d, want 3", seq)
			}
		})

		// (d) 2013 on attempt 1: hold the seq, back off, succeed on attempt 2.
		t.Run("d_2013_then_success", func(t *testing.T) {
			e, podA, acct := setup(t, mk, "fault-d")
			x := eid("fault-d", 1)
			e.sim.ForceInflightDuplicate()
			r, err := podA.Deposit(ctx, acct, 50, x)
			if err != nil || r != (Result{150, 2}) {
				t.Fatalf("got %+v, %v", r, err)
			}
			s := podA.sleeps.Sleeps()
			if len(s) != 1 || s[0] < 200*time.Millisecond || s[0] >= 250*time.Millisecond {
				t.Errorf("backoffs %v, want one in [200ms, 250ms)", s)
			}
			if evs := e.events(acct); len(evs) != 2 || evs[1].EventID != x || evs[1].ClientSeq != 2 {
				t.Errorf("log %+v: want the held seq 2 with the EventId", evs)
			}
		})

		// (e) 2002 with nothing at that seq (Unwritten): 409, never a guess, no write.
		t.Run("e_2002_unwritten", func(t *testing.T) {
			e, podA, acct := setup(t, mk, "fault-e")
			x := eid("fault-e", 1)
			e.sim.InjectWriteError(celeriant.CodeWriteClientIdempotency, "")
			_, err := podA.Deposit(ctx, acct, 50, x)
			var ce *ConflictError
			if !errors.Is(err, ErrConflict) || !errors.As(err, &ce) {
				t.Fatalf("got %v, want ErrConflict", err)
			}
			if e.countID(acct, x) != 0 || podA.store.writes != 2 {
				t.Errorf("nothing may be written after Unwritten")
			}
		})

		// (f) Three 2003s: 409 after three attempts and the reference's backoffs.
		t.Run("f_three_2003", func(t *testing.T) {
			e, podA, acct := setup(t, mk, "fault-f")
			x := eid("fault-f", 1)
			for range 3 {
				e.sim.ForceConflict()
			}
			_, err := podA.Deposit(ctx, acct, 50, x)
			if !errors.Is(err, ErrConflict) {
				t.Fatalf("got %v, want ErrConflict", err)
			}
			s := podA.sleeps.Sleeps()
			if len(s) != 2 || s[0] < 200*time.Millisecond || s[0] >= 250*time.Millisecond ||
				s[1] < 400*time.Millisecond || s[1] >= 450*time.Millisecond {
				t.Errorf("backoffs %v, want [200,250) ms then [400,450) ms", s)
			}
			if podA.store.writes != 4 || e.countID(acct, x) != 0 {
				t.Errorf("writes %d, want 1+3 and no event", podA.store.writes)
			}
		})

		// (g) The projection's record fails: still 200; the next request self-heals.
		t.Run("g_record_fails", func(t *testing.T) {
			e := newEnv(t, mk)
			proj := e.mk(t, e.clock, 0)
			svc, err := New(e.sim, failRecord{proj}, WithSleep(e.sleeper().Sleep), WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			acct := acctID("fault-g")
			x := eid("fault-g", 1)
			if r, err := svc.Deposit(ctx, acct, 100, x); err != nil || r != (Result{100, 1}) {
				t.Fatalf("deposit: %+v, %v", r, err)
			}
			// The retry replays the event into the index.
			if r, err := svc.Deposit(ctx, acct, 100, x); err != nil || r != (Result{100, 1}) {
				t.Fatalf("retry: %+v, %v", r, err)
			}
			if r, err := svc.Deposit(ctx, acct, 5, eid("fault-g", 2)); err != nil || r != (Result{105, 2}) {
				t.Fatalf("next deposit: %+v, %v; want {105, 2}", r, err)
			}
			if len(e.events(acct)) != 2 {
				t.Errorf("log has %d events, want 2", len(e.events(acct)))
			}
		})

		// (h) A retry after the window writes a second event (documented behaviour).
		t.Run("h_retry_after_window", func(t *testing.T) {
			e, podA, acct := setup(t, mk, "fault-h")
			x := eid("fault-h", 1)
			if r, err := podA.Deposit(ctx, acct, 50, x); err != nil || r != (Result{150, 2}) {
				t.Fatalf("deposit: %+v, %v", r, err)
			}
			e.clock.Add(DefaultWindow + time.Second)
			expireIndex(t, podA.proj)
			if r, err := podA.Deposit(ctx, acct, 50, x); err != nil || r != (Result{200, 3}) {
				t.Fatalf("late retry: %+v, %v; want a new write {200, 3}", r, err)
			}
			if n := e.countID(acct, x); n != 2 {
				t.Errorf("EventId appears %d times, want 2 after the window", n)
			}
		})

		// (i) Transfer partial hit: one leg's index row is gone; the other leg's hit proves
		// the transfer landed. 200, no new events, the missing leg rebuilt from state.
		t.Run("i_transfer_partial_hit", func(t *testing.T) {
			for _, missing := range []string{"to", "from"} {
				name := "fault-i-" + missing
				e, podA, from := setup(t, mk, name)
				to := acctID(name + "-to")
				x := eid(name, 1)
				want := TransferResult{From: Result{70, 2}, To: Result{30, 1}}
				if r, err := podA.Transfer(ctx, from, to, 30, x); err != nil || r != want {
					t.Fatalf("transfer: %+v, %v", r, err)
				}
				gone := to
				if missing == "from" {
					gone = from
				}
				deleteIndexRow(t, podA.proj, gone, x)
				if r, err := podA.Transfer(ctx, from, to, 30, x); err != nil || r != want {
					t.Fatalf("missing %s: retry %+v, %v; want %+v", missing, r, err, want)
				}
				if podA.store.writes != 2 || len(e.events(from)) != 2 || len(e.events(to)) != 1 {
					t.Errorf("missing %s: a partial hit must never write", missing)
				}
			}
		})

		// (j) Transfer 2002: the from leg reads Unwritten (a lagging replica hides it),
		// the to leg is Ours: success with both current states, no new events.
		t.Run("j_transfer_2002_from_unwritten_to_ours", func(t *testing.T) {
			e, podA, from := setup(t, mk, "fault-j")
			to := acctID("fault-j-to")
			x := eid("fault-j", 1)
			e.sim.LoseNextWriteAnswer()
			podA.store.afterWrite = func(n int, err error) {
				if n == 2 { // the transfer landed; push it out of the window on both legs
					e.clock.Add(DefaultWindow + time.Second)
					e.foreignWrite(from)
					e.foreignWrite(to)
				}
			}
			pointReads := 0
			podA.store.read = func(req celeriant.ReadRequest) (celeriant.ReadResult, error, bool) {
				if req.Filters.MinClientSeq != nil {
					pointReads++
					if req.Key == Key(from) {
						return celeriant.ReadResult{}, nil, true
					}
				}
				return celeriant.ReadResult{}, nil, false
			}
			r, err := podA.Transfer(ctx, from, to, 30, x)
			want := TransferResult{From: Result{70, 3}, To: Result{30, 2}}
			if err != nil || r != want {
				t.Fatalf("got %+v, %v; want %+v", r, err, want)
			}
			if pointReads != 2 || podA.store.writes != 3 {
				t.Errorf("point reads %d (want 2: from, then to), writes %d (want 3)", pointReads, podA.store.writes)
			}
			if e.countID(from, x) != 1 || e.countID(to, x) != 1 {
				t.Errorf("the transfer must be in the log exactly once per leg")
			}
		})

		// (k) A non-UUID Idempotency-Key: EventId = UUIDv5(scope, key), so its retries are
		// deduplicated across replicas, and another scope's identical key is a new request.
		t.Run("k_non_uuid_key", func(t *testing.T) {
			e, podA, acct := setup(t, mk, "fault-k")
			podB := e.pod(0)
			x := EventIDFor("tenant-a", "order 42 / not a uuid", Operation("deposit", 50, acct))
			if r, err := podA.Deposit(ctx, acct, 50, x); err != nil || r != (Result{150, 2}) {
				t.Fatalf("first: %+v, %v", r, err)
			}
			if r, err := podB.Deposit(ctx, acct, 50, EventIDFor("tenant-a", "order 42 / not a uuid", Operation("deposit", 50, acct))); err != nil || r != (Result{150, 2}) {
				t.Fatalf("retry on pod_b: %+v, %v", r, err)
			}
			if r, err := podB.Deposit(ctx, acct, 50, EventIDFor("tenant-b", "order 42 / not a uuid", Operation("deposit", 50, acct))); err != nil || r != (Result{200, 3}) {
				t.Fatalf("other scope: %+v, %v", r, err)
			}
			if e.countID(acct, x) != 1 || len(e.events(acct)) != 3 {
				t.Errorf("want the keyed deposit once and the other scope's as its own event")
			}
		})
	})
}
