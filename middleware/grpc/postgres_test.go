package idemgrpc_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// postgresStore returns a migrated Postgres store in a schema of its own,
// dropped when the test ends; it skips without DATABASE_URL (fails when
// CI=true).
func postgresStore(t *testing.T) *postgres.Store {
	t.Helper()
	s, _ := postgresStorePool(t)
	return s
}

// postgresStorePool is postgresStore, with the store's pool.
func postgresStorePool(t *testing.T) (*postgres.Store, *pgxpool.Pool) {
	t.Helper()
	url := testenv.Getenv(t, "DATABASE_URL", "a Postgres server")
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("DATABASE_URL: %v", err)
	}
	t.Cleanup(pool.Close)
	schema := "idemkey_grpc_" + store.NewToken().String()[:12]
	s, err := postgres.New(pool, postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(s.StopWaiters)
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return s, pool
}

func TestReplayAndMismatchPostgres(t *testing.T) { testReplayAndMismatch(t, postgresStore(t)) }
