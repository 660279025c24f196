// Command retention measures the Postgres store's sweep at scale, in the plain
// layout (DELETE in batches) or the partitioned one (WithPartitions: the
// expired epoch's partition is detached and dropped). It fills a fresh schema
// with -rows records, -expired of them past their retention (in the
// partitioned layout: all in one past epoch's partition), runs claims of new
// keys for a baseline window, then sweeps while the claims go on, and prints
// the sweep's duration, the WAL written meanwhile (pg_current_wal_lsn) and the
// claim throughput during the sweep over the baseline's.
//
// The WAL is the server's: run it against a private cluster, with -claimers 0
// for the sweep's WAL alone (docs/operations.md shows one). From the repository root:
//
//	cd benchmarks && DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable \
//	    go run ./retention -layout partitioned -rows 5000000 -expired 1000000
//
// It drops and recreates the schema idemkey_retention_bench. Not run in CI.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	pgstore "github.com/idemkey/idemkey/store/postgres"
)

const (
	schema = "idemkey_retention_bench"
	epoch  = time.Hour
)

func main() {
	layout := flag.String("layout", "plain", "plain or partitioned")
	rows := flag.Int("rows", 5_000_000, "records in the table before the sweep")
	expired := flag.Int("expired", 1_000_000, "records among them past their retention")
	claimers := flag.Int("claimers", 4, "goroutines claiming new keys (0: the sweep alone)")
	window := flag.Duration("window", 3*time.Second, "the warm-up and then the baseline claim window")
	flag.Parse()
	url := os.Getenv("DATABASE_URL")
	if url == "" || (*layout != "plain" && *layout != "partitioned") || *expired > *rows {
		log.Fatal("usage: DATABASE_URL=... retention -layout plain|partitioned -rows N -expired M (M <= N)")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	st, err := setup(ctx, pool, *layout, *rows, *expired)
	if err != nil {
		log.Fatal(err)
	}
	r := run(ctx, pool, st, *claimers, *window)
	fmt.Printf("layout=%s rows=%d expired=%d claimers=%d\n", *layout, *rows, *expired, *claimers)
	fmt.Printf("sweep: %v, %d rows reported, WAL %.1f MB\n", r.took.Round(time.Millisecond), r.swept, float64(r.wal)/1e6)
	if *claimers > 0 {
		fmt.Printf("claims/s: baseline %.0f, during the sweep %.0f (window %v), ratio %.2f\n",
			r.before, r.during, r.duringWindow.Round(time.Millisecond), r.during/r.before)
	}
}

// setup recreates the schema, migrates a store of the layout and fills it.
func setup(ctx context.Context, pool *pgxpool.Pool, layout string, rows, expired int) (*pgstore.Store, error) {
	opts := []pgstore.Option{pgstore.WithSchema(schema)}
	if layout == "partitioned" {
		opts = append(opts, pgstore.WithPartitions(epoch))
	}
	st, err := pgstore.New(pool, opts...)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
		return nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := fill(ctx, pool, st.Table(), layout, rows, expired); err != nil {
		return nil, fmt.Errorf("fill: %w", err)
	}
	for _, sql := range []string{`VACUUM ANALYZE ` + st.Table(), `CHECKPOINT`} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return nil, fmt.Errorf("%s: %w", sql, err)
		}
	}
	log.Printf("filled %d rows in %v", rows, time.Since(start).Round(time.Second))
	return st, nil
}

// fill inserts the records in one statement: the expired ones first (in the
// partitioned layout into the partition of two epochs ago, which it creates),
// the live ones split between the previous and the current epochs.
func fill(ctx context.Context, pool *pgxpool.Pool, table, layout string, rows, expired int) error {
	cols, epochExpr := "", ""
	if layout == "partitioned" {
		var cur int64
		if err := pool.QueryRow(ctx, `SELECT floor(extract(epoch FROM clock_timestamp()) / $1)::bigint`, int64(epoch.Seconds())).Scan(&cur); err != nil {
			return err
		}
		for _, n := range []int64{cur - 2, cur - 1} {
			sql := fmt.Sprintf(`CREATE TABLE %s.idemkey_records_p%d PARTITION OF %s FOR VALUES FROM (%d) TO (%d)`, schema, n, table, n, n+1)
			if _, err := pool.Exec(ctx, sql); err != nil {
				return err
			}
		}
		cols = "epoch, "
		epochExpr = fmt.Sprintf("CASE WHEN g <= $2 THEN %d WHEN g %% 2 = 0 THEN %d ELSE %d END, ", cur-2, cur-1, cur)
	}
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (`+cols+`scope, key, fingerprint, token, status, body, created_at, completed_at, expires_at)
SELECT `+epochExpr+`'\x62656e6368'::bytea, convert_to('k' || g, 'UTF8'), sha256(convert_to('k' || g, 'UTF8')),
       substr(sha256(convert_to('t' || g, 'UTF8')), 1, 16), 200, '\x7b226f6b223a747275657d'::bytea,
       now() - interval '2 hours', now() - interval '2 hours',
       CASE WHEN g <= $2 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END
FROM generate_series(1, $1::bigint) AS g`, rows, expired)
	return err
}

type result struct {
	took           time.Duration
	swept, wal     int64
	before, during float64 // claims per second
	duringWindow   time.Duration
}

// run measures the claim rate for window, then sweeps with the claims going on
// and measures the rate over the sweep (at least one second of it).
func run(ctx context.Context, pool *pgxpool.Pool, st *pgstore.Store, claimers int, window time.Duration) result {
	var n atomic.Int64
	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range claimers {
		wg.Go(func() { claim(cctx, st, &n) })
	}
	var r result
	if claimers > 0 {
		time.Sleep(window) // warm up: caches, the first writes after the checkpoint
		c0, t0 := n.Load(), time.Now()
		time.Sleep(window)
		r.before = float64(n.Load()-c0) / time.Since(t0).Seconds()
	}
	lsn0 := lsn(ctx, pool)
	c0, t0 := n.Load(), time.Now()
	swept, err := st.Sweep(ctx, 0)
	r.took = time.Since(t0)
	if err != nil {
		log.Fatalf("sweep: %v", err)
	}
	r.swept, r.wal = swept, lsnDiff(ctx, pool, lsn0)
	if claimers > 0 {
		time.Sleep(time.Second - r.took) // no-op once the sweep took a second or more
		r.duringWindow = time.Since(t0)
		r.during = float64(n.Load()-c0) / r.duringWindow.Seconds()
	}
	stop()
	wg.Wait()
	return r
}

// claim claims new keys until ctx ends, counting them in n.
func claim(ctx context.Context, st *pgstore.Store, n *atomic.Int64) {
	for ctx.Err() == nil {
		req := store.ClaimRequest{ID: store.ID{Scope: "bench", Key: "new-" + store.NewToken().String()},
			Fingerprint: store.Fingerprint{1}, Lease: time.Minute, Retention: 30 * time.Minute}
		if _, err := st.Claim(ctx, req); err != nil {
			if ctx.Err() == nil {
				log.Fatalf("claim: %v", err)
			}
			return
		}
		n.Add(1)
	}
}

func lsn(ctx context.Context, pool *pgxpool.Pool) string {
	var s string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		log.Fatal(err)
	}
	return s
}

func lsnDiff(ctx context.Context, pool *pgxpool.Pool, from string) int64 {
	var d int64
	if err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, from).Scan(&d); err != nil {
		log.Fatal(err)
	}
	return d
}
