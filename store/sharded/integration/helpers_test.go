package integration

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// databases returns pools on DATABASE_URL and on its sibling database (the
// same name with "b" appended, created when absent), closed at cleanup. Without
// DATABASE_URL the test is skipped, unless CI=true: then it fails.
func databases(t testing.TB) [2]*pgxpool.Pool {
	t.Helper()
	first := testenv.Getenv(t, "DATABASE_URL", "a Postgres server")
	u, err := url.Parse(first)
	if err != nil || strings.Trim(u.Path, "/") == "" {
		t.Fatalf("DATABASE_URL %q names no database (%v)", first, err)
	}
	a := connect(t, first)
	name := strings.Trim(u.Path, "/") + "b"
	_, err = a.Exec(t.Context(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505")) {
		t.Fatalf("create the second database %s: %v", name, err)
	}
	u.Path = "/" + name
	return [2]*pgxpool.Pool{a, connect(t, u.String())}
}

func connect(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// shardStore returns a migrated Postgres store on pool in a schema of its own,
// dropped at cleanup, and the schema's name.
func shardStore(t testing.TB, pool *pgxpool.Pool, opts ...postgres.Option) (*postgres.Store, string) {
	t.Helper()
	schema := "idemkey_shard_" + store.NewToken().String()[:12]
	s, err := postgres.New(pool, append([]postgres.Option{postgres.WithSchema(schema)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.StopWaiters)
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return s, schema
}

func fingerprint(s string) store.Fingerprint {
	var f store.Fingerprint
	copy(f[:], s)
	return f
}
