package main

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	pgstore "github.com/idemkey/idemkey/store/postgres"
)

// TestCommitsPerFirstExecution: the tracer counts the commits a first execution
// makes, one for each mode that writes in one transaction, the one-transaction
// mode with WithReadFirst included: its read outside a transaction writes no
// WAL (it used to be counted, 2 commits per first execution).
func TestCommitsPerFirstExecution(t *testing.T) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("DATABASE_URL is not set; CI=true requires a Postgres server")
		}
		t.Skip("DATABASE_URL is not set; skipping the tracer's count against Postgres")
	}
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	schema := "writepath_" + store.NewToken().String()[:12]
	if _, err := admin.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	defer admin.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.Tracer = tracer{}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st, err := pgstore.New(pool, pgstore.WithTable(recordsTable), pgstore.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	for mode, want := range map[string]float64{"none": 1, "record": 1, "onetx": 1, "onetxread": 1} {
		r, err := runMode(ctx, mode, pool, st, 20, 2, 1)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if r.firsts != 20 || r.commi != want {
			t.Errorf("%s: %d first executions, %.2f commits each; want 20 and %v", mode, r.firsts, r.commi, want)
		}
	}
}
