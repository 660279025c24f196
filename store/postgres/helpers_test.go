package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
)

// databaseURL returns DATABASE_URL, skipping the test when it is unset (failing
// instead when CI=true, where a missing server is a broken setup).
func databaseURL(t testing.TB) string {
	t.Helper()
	u := testenv.Getenv(t, "DATABASE_URL", "a Postgres server")
	return u
}

// newPool connects to url (DATABASE_URL when empty) and closes the pool when the
// test ends. configure may adjust the pool's settings.
func newPool(t testing.TB, url string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	if url == "" {
		url = databaseURL(t)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newStore returns a migrated store in a schema of its own (random name), dropped
// when the test ends. admin runs the migration and the cleanup; the store's
// statements go through db (admin when nil).
func newStore(t testing.TB, admin *pgxpool.Pool, db Querier, opts ...Option) *Store {
	t.Helper()
	if db == nil {
		db = admin
	}
	schema := "idemkey_test_" + store.NewToken().String()[:12]
	s, err := New(db, append([]Option{WithSchema(schema)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ms, err := New(admin, append([]Option{WithSchema(schema)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := ms.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(s.StopWaiters) // runs before the drop below
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop test schema %s: %v", schema, err)
		}
	})
	return s
}

func fingerprint(s string) store.Fingerprint {
	var f store.Fingerprint
	copy(f[:], s)
	return f
}

func newID() store.ID {
	return store.ID{Scope: "tenant", Key: "key-" + store.NewToken().String()}
}
