package stores

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql/mysqltest"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/tiered"
)

// side is one store under measurement and its latencies.
type side struct {
	name           string
	s              store.Store
	pairs, replays []time.Duration
}

// need returns the variable's value, or "" after logging that the store is left
// out (a failure when CI=true).
func need(b *testing.B, name string) string {
	v := os.Getenv(name)
	if v == "" {
		if testenv.CI() {
			b.Fatalf("%s is not set (required when CI=true)", name)
		}
		b.Logf("%s is not set: that store is left out", name)
	}
	return v
}

func pool(b *testing.B, url string) *pgxpool.Pool {
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p
}

// pgStore is a migrated Postgres store on p in a schema of its own, which admin
// drops at cleanup.
func pgStore(b *testing.B, p, admin *pgxpool.Pool, opts ...postgres.Option) store.Store {
	schema := "idemkey_bench_" + store.NewToken().String()[:12]
	s, err := postgres.New(p, append([]postgres.Option{postgres.WithSchema(schema)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}

func sides(b *testing.B) []*side {
	var out []*side
	var admin *pgxpool.Pool
	if url := need(b, "DATABASE_URL"); url != "" {
		admin = pool(b, url)
		out = append(out, &side{name: "postgres", s: pgStore(b, admin, admin)})
		if url := os.Getenv("PGBOUNCER_URL"); url != "" {
			out = append(out, &side{name: "pgbouncer", s: pgStore(b, pool(b, url), admin, postgres.WithTransactionPooler())})
		}
	}
	if dsn := need(b, "MYSQL_DSN"); dsn != "" {
		out = append(out, &side{name: "mysql", s: mysqltest.Store(b, mysqltest.DB(b))})
	}
	if url := need(b, "REDIS_URL"); url != "" {
		o, err := goredis.ParseURL(url)
		if err != nil {
			b.Fatal(err)
		}
		c := goredis.NewClient(o)
		b.Cleanup(func() { _ = c.Close() })
		prefix := "idemkey-bench:" + store.NewToken().String()[:12] + ":"
		b.Cleanup(func() {
			ctx := context.Background()
			for it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator(); it.Next(ctx); {
				c.Del(ctx, it.Val())
			}
		})
		rs, err := redis.New(c, redis.WithPrefix(prefix))
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, &side{name: "redis", s: rs})
		if admin != nil { // Redis in front of a Postgres store of its own
			fast, err := redis.New(c, redis.WithPrefix(prefix+"tiered:"))
			if err != nil {
				b.Fatal(err)
			}
			ts, err := tiered.New(fast, pgStore(b, admin, admin))
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, &side{name: "tiered", s: ts})
		}
	}
	if len(out) == 0 {
		b.Skip("no store configured")
	}
	return out
}

// BenchmarkStores measures, per store and in one run, the latency of a claim
// followed by the completion of a new key (2 round trips on every store; MySQL's
// claim of a new key is a read and an insert: 3) and of a replay (a claim
// answered Completed: 1 round trip), at concurrency 1, interleaved store by
// store. It reports each store's median in µs.
func BenchmarkStores(b *testing.B) {
	all := sides(b)
	ctx := context.Background()
	resp := store.Response{Status: 201, Body: []byte(`{"id":42,"status":"captured"}`)}
	var fp store.Fingerprint
	replayed := store.ID{Scope: "bench", Key: "replayed"}
	for _, sd := range all { // warm: prepared statements, scripts, connections
		r, err := sd.s.Claim(ctx, store.ClaimRequest{ID: replayed, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour})
		if err != nil || r.Outcome != store.Claimed {
			b.Fatalf("%s: %+v %v", sd.name, r, err)
		}
		if err := sd.s.Complete(ctx, replayed, r.Token, resp, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		id := store.ID{Scope: "bench", Key: fmt.Sprintf("key-%d", i)}
		for _, sd := range all {
			t0 := time.Now()
			r, err := sd.s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour})
			if err == nil {
				err = sd.s.Complete(ctx, id, r.Token, resp, time.Hour)
			}
			t1 := time.Now()
			if err != nil || r.Outcome != store.Claimed {
				b.Fatalf("%s: %+v %v", sd.name, r, err)
			}
			r, err = sd.s.Claim(ctx, store.ClaimRequest{ID: replayed, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour})
			t2 := time.Now()
			if err != nil || r.Outcome != store.Completed {
				b.Fatalf("%s replay: %+v %v", sd.name, r, err)
			}
			sd.pairs, sd.replays = append(sd.pairs, t1.Sub(t0)), append(sd.replays, t2.Sub(t1))
		}
	}
	b.StopTimer()
	for _, sd := range all {
		b.ReportMetric(median(sd.pairs), sd.name+"-claim+complete-µs")
		b.ReportMetric(median(sd.replays), sd.name+"-replay-µs")
	}
}

func median(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2].Nanoseconds()) / 1000
}
