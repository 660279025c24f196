package postgres

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/store"
)

// TestHugeDurationsKeepTheKey: a lease and retention of math.MaxInt64 ("forever")
// must not wrap around to a deadline in the past, which would make every claim of
// the key a fresh one (a second execution).
func TestHugeDurationsKeepTheKey(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	s := newStore(t, pool, nil)
	id := newID()
	r := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: math.MaxInt64, Retention: math.MaxInt64}
	res, err := s.Claim(ctx, r)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("first claim: %+v, %v", res, err)
	}
	if again, err := s.Claim(ctx, r); err != nil || again.Outcome != store.InFlight || again.RetryAfter < 290*365*24*time.Hour {
		t.Fatalf("second claim during a 292-year lease: %+v, %v; want in flight for about 292 years", again, err)
	}
	if err := s.Complete(ctx, id, res.Token, store.Response{Status: 200}, math.MaxInt64); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if rep, err := s.Claim(ctx, r); err != nil || rep.Outcome != store.Completed {
		t.Fatalf("claim after Complete with a 292-year retention: %+v, %v; want completed", rep, err)
	}
}

// TestMigrateSharedSchemaConcurrently: applications with their own tables in one
// new schema start at once. CREATE SCHEMA IF NOT EXISTS is not safe against a
// concurrent twin (it fails on pg_namespace's unique index), so Migrate must
// serialise on the schema, not only on the table.
func TestMigrateSharedSchemaConcurrently(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	for round := range 5 {
		schema := "idemkey_test_shared_" + store.NewToken().String()[:12]
		t.Cleanup(func() {
			if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
				t.Errorf("drop test schema %s: %v", schema, err)
			}
		})
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for i := range 4 {
			s, err := New(pool, WithSchema(schema), WithTable(fmt.Sprintf("app%d_records", i)))
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() { errs <- s.Migrate(ctx) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: concurrent Migrate of tables in one schema: %v", round, err)
			}
		}
	}
}

// TestRetryAfterDoesNotOverflow: a remaining lease of 9223372036855 ms (a lease of
// math.MaxInt64 read back at once) must not wrap to a negative RetryAfter.
func TestRetryAfterDoesNotOverflow(t *testing.T) {
	s := &Store{}
	r := &claimRow{sameFP: true}
	r.retryMS.Int64, r.retryMS.Valid = 9_223_372_036_855, true
	res, err := s.decide(r, store.ClaimRequest{}, store.Token{})
	if err != nil || res.Outcome != store.InFlight || res.RetryAfter < 290*365*24*time.Hour {
		t.Fatalf("decide: %+v, %v; want in flight for about 292 years", res, err)
	}
}
