package replay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	pgstore "github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/tiered"
)

// BenchmarkReplay replays one completed record (a small JSON answer with its
// Content-Type) through each store, one claim per iteration, at concurrency 1:
// ns/op is the replay's latency, allocs/op the store's own (the middleware adds
// none on its replay path). Each sub-benchmark completes its record first.
func BenchmarkReplay(b *testing.B) {
	pool := pgPool(b)
	rdb := redistest.Shared(b) // REDIS_URL
	newPG := func(b *testing.B) *pgstore.Store { return postgresStore(b, pool) }
	newRedis := func(b *testing.B) *redis.Store {
		rs, err := redis.New(rdb, redis.WithPrefix(redistest.Prefix(b, rdb)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(rs.StopWaiters)
		return rs
	}
	for _, tc := range []struct {
		name string
		open func(b *testing.B) store.Store
	}{
		{"tiered-memory-postgres", func(b *testing.B) store.Store { return mustTiered(b, memory.New(), newPG(b)) }},
		{"tiered-redis-postgres", func(b *testing.B) store.Store { return mustTiered(b, newRedis(b), newPG(b)) }},
		{"postgres", func(b *testing.B) store.Store { return newPG(b) }},
		{"redis", func(b *testing.B) store.Store { return newRedis(b) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := tc.open(b)
			req := completed(b, s)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if res, err := s.Claim(ctx, req); err != nil || res.Outcome != store.Completed {
					b.Fatalf("replay: %v %v", res.Outcome, err)
				}
			}
		})
	}
}

// completed claims and completes one key on s and replays it once (prepared
// statements, loaded scripts), and returns its claim request.
func completed(b *testing.B, s store.Store) store.ClaimRequest {
	ctx := context.Background()
	req := store.ClaimRequest{ID: store.ID{Scope: "tenant-1", Key: "order-42"}, Fingerprint: store.Fingerprint{7},
		Lease: 10 * time.Second, Retention: time.Hour}
	res, err := s.Claim(ctx, req)
	if err != nil || res.Outcome != store.Claimed {
		b.Fatalf("claim: %v %v", res.Outcome, err)
	}
	resp := store.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"balanceCents":98766,"aggregateVersion":42}`)}
	if err := s.Complete(ctx, req.ID, res.Token, resp, time.Hour); err != nil {
		b.Fatal(err)
	}
	if res, err := s.Claim(ctx, req); err != nil || res.Outcome != store.Completed {
		b.Fatalf("first replay: %v %v", res.Outcome, err)
	}
	return req
}

func mustTiered(b *testing.B, fast tiered.Cache, back store.Store) *tiered.Store {
	s, err := tiered.New(fast, back)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// pgPool connects to DATABASE_URL: skipped without it, a failure when CI=true.
func pgPool(b *testing.B) *pgxpool.Pool {
	url := testenv.Getenv(b, "DATABASE_URL", "a Postgres server")
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// postgresStore is a migrated Postgres store in a schema of its own, dropped
// at cleanup.
func postgresStore(b *testing.B, pool *pgxpool.Pool) *pgstore.Store {
	schema := "idemkey_bench_" + store.NewToken().String()[:12]
	b.Cleanup(func() {
		pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	s, err := pgstore.New(pool, pgstore.WithSchema(schema))
	if err == nil {
		err = s.Migrate(context.Background())
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.StopWaiters)
	return s
}
