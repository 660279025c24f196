package postgres

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/storetest"
)

// pgbouncerPool connects to PGBOUNCER_URL, a PgBouncer in transaction pooling
// mode in front of DATABASE_URL's server (.ci/run starts one), with pgx's
// defaults: the statement cache, which such a pooler breaks. Skipped without
// PGBOUNCER_URL, unless CI=true: then it fails.
func pgbouncerPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := testenv.Getenv(t, "PGBOUNCER_URL", "PgBouncer in front of the test Postgres")
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
	t.Cleanup(s.StopWaiters)
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

// TestPgBouncerWithoutTheOption: a store configured for a direct connection,
// put behind PgBouncer, never guesses: a statement that meets pgx's statement
// cache across server connections fails with ErrTransactionPooler (no claim is
// sent twice), and Wait still listens (nothing switches it to polling).
func TestPgBouncerWithoutTheOption(t *testing.T) {
	admin, bouncer := newPool(t, ""), pgbouncerPool(t)
	// Migrated directly: PgBouncer's server connections keep the statements
	// earlier clients prepared, so an unconfigured Migrate through it may fail
	// too (with ErrTransactionPooler); this test is about the claims.
	s := newStore(t, admin, bouncer, WithWaiterIdle(0))
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
	failed := 0
	for err := range errs {
		failed++
		if !errors.Is(err, ErrTransactionPooler) {
			t.Errorf("claim through PgBouncer: %v, want ErrTransactionPooler", err)
		}
	}
	// Whether a concurrent claim met a server connection without its statement
	// depends on PgBouncer's assignment; every failure must name the option.
	t.Logf("%d of 64 concurrent claims met the pooler", failed)
	if st := s.Stats(); st.Polling || st.PoolerExecMode {
		t.Fatalf("the store switched modes on its own: %+v", st)
	}
	// Two clients, one after the other: PgBouncer hands the second the server
	// connection the first just prepared the claim statement on (it reuses the
	// last one freed), so the second's prepare meets it (42P05).
	u := os.Getenv("PGBOUNCER_URL")
	var errs2 []error
	for range 2 {
		c, err := New(newPool(t, u, func(c *pgxpool.Config) { c.MaxConns = 1 }), WithSchema(s.schema))
		if err != nil {
			t.Fatal(err)
		}
		id := store.ID{Scope: "tenant", Key: "seq-" + store.NewToken().String()[:8]}
		if _, err := c.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}); err != nil {
			errs2 = append(errs2, err)
		}
	}
	if len(errs2) == 0 {
		t.Fatal("two clients prepared the claim statement on one server connection without an error")
	}
	for _, err := range errs2 {
		if !errors.Is(err, ErrTransactionPooler) {
			t.Errorf("sequential claim through PgBouncer: %v, want ErrTransactionPooler", err)
		}
	}
}

// TestPoolerErr: the statement-cache errors of a transaction pooler, and only
// they, are answered ErrTransactionPooler, the driver's error still wrapped.
func TestPoolerErr(t *testing.T) {
	for code, want := range map[string]bool{"26000": true, "42P05": true, "40001": false, "23505": false} {
		pgErr := &pgconn.PgError{Code: code}
		err := poolerErr(fmt.Errorf("claim: %w", pgErr))
		if errors.Is(err, ErrTransactionPooler) != want || !errors.Is(err, pgErr) {
			t.Errorf("%s: %v", code, err)
		}
	}
	if poolerErr(nil) != nil {
		t.Error("nil error wrapped")
	}
}
