package postgres

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/storetest"
)

// pgbouncerPool connects to PGBOUNCER_URL, a PgBouncer in transaction pooling
// mode in front of DATABASE_URL's server (.ci/run starts one), with pgx's
// defaults: the statement cache, which such a pooler breaks. Skipped without
// PGBOUNCER_URL, unless CI=true: then it fails.
func pgbouncerPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := os.Getenv("PGBOUNCER_URL")
	if u == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("PGBOUNCER_URL is not set; CI=true requires PgBouncer in front of the test Postgres")
		}
		t.Skip("PGBOUNCER_URL is not set; skipping the tests through PgBouncer")
	}
	return newPool(t, u)
}

// bouncedStore returns a store whose every statement, Migrate's included, goes
// through PgBouncer, in a schema of its own that admin drops at cleanup.
func bouncedStore(t testing.TB, admin, bouncer *pgxpool.Pool, opts ...Option) *Store {
	t.Helper()
	schema := "idemkey_bounced_" + store.NewToken().String()[:12]
	s, err := New(bouncer, append([]Option{WithSchema(schema)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(s.StopListener)
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate through PgBouncer: %v", err)
	}
	return s
}

// TestConformanceThroughPgBouncer runs the whole suite through PgBouncer in
// transaction mode with WithTransactionPooler: statements without prepared
// statements, and Wait by polling. A Wait that listened would never be woken
// (the server connection that ran LISTEN goes back to the pool), and
// WaitWakes would fail after its 10 s bound.
func TestConformanceThroughPgBouncer(t *testing.T) {
	admin, bouncer := newPool(t, ""), pgbouncerPool(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: bouncedStore(t, admin, bouncer, WithTransactionPooler())}
	})
}

// TestWaitingThroughPgBouncer: the middleware's waiting duplicates, through
// PgBouncer, are woken by polling; no listening connection is opened.
func TestWaitingThroughPgBouncer(t *testing.T) {
	admin, bouncer := newPool(t, ""), pgbouncerPool(t)
	var stores []*Store
	storetest.RunWaiting(t, func(t *testing.T) storetest.WaitSubject {
		s := bouncedStore(t, admin, bouncer, WithTransactionPooler())
		stores = append(stores, s)
		return storetest.WaitSubject{Store: s}
	})
	for _, s := range stores {
		if st := s.Stats(); st.Listening || !st.Polling {
			t.Errorf("stats %+v: want polling and no listening connection", st)
		}
	}
}

// TestPgBouncerDetected: a store configured for a direct connection, put behind
// PgBouncer, detects it: concurrent claims that hit pgx's statement cache are
// sent again without it (no claim fails; Migrate, whose transaction such an
// error aborts, runs again), and a Wait whose listening connection
// never gets its probe notification wakes and polls from then on.
func TestPgBouncerDetected(t *testing.T) {
	admin, bouncer := newPool(t, ""), pgbouncerPool(t)
	s := bouncedStore(t, admin, bouncer, WithListenerIdle(0))
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			id := store.ID{Scope: "tenant", Key: "detect-" + store.NewToken().String()[:8]}
			if i%2 == 0 {
				id.Key = "shared"
			}
			if _, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("claim through PgBouncer: %v", err)
	}
	// Whether a claim met a server connection with or without the statement
	// depends on PgBouncer's assignment; none may fail either way.
	t.Logf("statement cache errors met and detected: %v", s.Stats().PoolerExecMode)
	id := store.ID{Scope: "tenant", Key: "waited"}
	r, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour})
	if err != nil || r.Outcome != store.Claimed {
		t.Fatalf("claim: %+v %v", r, err)
	}
	done := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 3*ListenProbeTimeout)
		defer cancel()
		for { // a spurious wake-up (the probe failed) is followed by a poll
			if err := s.Wait(wctx, id); err != nil {
				done <- err
				return
			}
			info, err := s.Inspect(wctx, id)
			if err != nil || info.State != store.StateInFlight {
				done <- err
				return
			}
		}
	}()
	if err := s.Complete(ctx, id, r.Token, store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Wait through PgBouncer = %v, want woken", err)
	}
	if !s.Stats().Polling {
		t.Error("the deaf listener was not detected")
	}
}
