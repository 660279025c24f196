package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
)

// waitBlockedBy returns once a statement of another session waits for a lock held
// by the backend pid, polling the server's lock table (up to 10 s).
func waitBlockedBy(t *testing.T, pool *pgxpool.Pool, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		if err := pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE $1 = ANY(pg_blocking_pids(pid)))`, pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no statement blocked on the uncommitted row")
		}
		time.Sleep(5 * time.Millisecond) // polling the server's lock table
	}
}

// TestEvictJudgesTheCommittedRow: Evict waits for a concurrent transition of the
// key and judges the row as committed, not as its snapshot saw it. A completion
// committed meanwhile is evicted as completed; an abandoned claim taken over
// meanwhile is no longer abandoned and is kept.
func TestEvictJudgesTheCommittedRow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		policy  store.EvictPolicy
		expired bool // the record's lease has expired before the transition
		evicted bool
		state   store.State
	}{
		{"completion", store.EvictCompleted, false, true, store.StateCompleted},
		{"takeover", store.EvictLeaseExpired, true, false, store.StateInFlight},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := newPool(t, "")
			ctx := t.Context()
			s := newStore(t, pool, nil)
			id := newID()
			fp := fingerprint("a")
			lease := "1 minute"
			if tc.expired {
				lease = "-1 second"
			}
			tok := store.NewToken()
			if _, err := pool.Exec(ctx, `INSERT INTO `+s.Table()+` (scope, key, fingerprint, token, lease_until, created_at, expires_at)
				VALUES ($1, $2, $3, $4, now() + $5::interval, now(), now() + interval '1 hour')`,
				[]byte(id.Scope), []byte(id.Key), fp[:], tok[:], lease); err != nil {
				t.Fatal(err)
			}

			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			inTx, err := New(tx, WithSchema(s.schema), WithTable(s.table))
			if err != nil {
				t.Fatal(err)
			}
			if tc.expired {
				res, err := inTx.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour})
				if err != nil || !res.Takeover {
					t.Fatalf("takeover: %+v %v", res, err)
				}
			} else if err := inTx.Complete(ctx, id, tok, store.Response{Status: 201, Body: []byte("done")}, time.Hour); err != nil {
				t.Fatal(err)
			}

			type answer struct {
				found   store.Info
				evicted bool
				err     error
			}
			done := make(chan answer, 1)
			go func() {
				found, evicted, err := s.Evict(ctx, id, tc.policy)
				done <- answer{found, evicted, err}
			}()
			waitBlockedBy(t, pool, pid)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			a := <-done
			if a.err != nil || a.evicted != tc.evicted || a.found.State != tc.state {
				t.Fatalf("Evict(%v): %+v, evicted %v, %v; want %v, evicted %v", tc.policy, a.found, a.evicted, a.err, tc.state, tc.evicted)
			}
			want := store.StateAbsent
			if tc.expired {
				want = store.StateInFlight
				if !a.found.LeaseLive() {
					t.Errorf("refused Evict reports %+v, want the new holder's live lease", a.found)
				}
			} else if a.found.Status != 201 || a.found.BodyBytes != 4 {
				t.Errorf("Evict found %+v, want the committed completion", a.found)
			}
			if info, err := s.Inspect(ctx, id); err != nil || info.State != want {
				t.Fatalf("Inspect after Evict: %v %v, want %v", info.State, err, want)
			}
		})
	}
}

// TestInspectorStatements: Inspect and Evict send one statement each, whatever
// they find.
func TestInspectorStatements(t *testing.T) {
	tracer := &countingTracer{}
	admin := newPool(t, "")
	traced := newPool(t, "", func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	s := newStore(t, admin, traced)
	ctx := t.Context()
	id := newID()
	if _, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		do   func() error
	}{
		{"inspect in flight", func() error { _, err := s.Inspect(ctx, id); return err }},
		{"refused evict", func() error { _, _, err := s.Evict(ctx, id, store.EvictSettled); return err }},
		{"forced evict", func() error { _, _, err := s.Evict(ctx, id, store.EvictAny); return err }},
		{"inspect absent", func() error { _, err := s.Inspect(ctx, id); return err }},
		{"evict absent", func() error { _, _, err := s.Evict(ctx, id, store.EvictAny); return err }},
	}
	tracer.take()
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if n := tracer.take(); n != 1 {
			t.Errorf("%s sent %d statements, want 1", st.name, n)
		}
	}
}
