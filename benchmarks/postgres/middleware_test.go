package postgres

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	pgstore "github.com/idemkey/idemkey/store/postgres"
)

// BenchmarkMiddleware measures requests per second through the middleware (in
// process, no network between client and server) with the Postgres store, at
// concurrency 1 and 8: "first" runs every request with a new key (claim, handler,
// complete: 2 statements), "replay" repeats one completed key (1 statement).
func BenchmarkMiddleware(b *testing.B) {
	url := testenv.Getenv(b, "DATABASE_URL", "a Postgres server")
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	schema := "idemkey_bench_" + store.NewToken().String()[:12]
	defer pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	st, err := pgstore.New(pool, pgstore.WithSchema(schema))
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	mw, err := middleware.New(st, middleware.ScopeFromHeader("X-Client-ID", "anonymous"),
		middleware.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		b.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"balanceCents":98766,"aggregateVersion":42}`)
	}))
	body := `{"fromAccountId":"acc-1","toAccountId":"acc-2","amountCents":1234}`
	var seq atomic.Int64
	serve := func(key string, want int) error {
		r := httptest.NewRequest(http.MethodPost, "/api/transfers", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("X-Client-ID", "bench")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			return fmt.Errorf("key %s: status %d, want %d: %s", key, w.Code, want, w.Body)
		}
		return nil
	}
	if err := serve("replayed", http.StatusCreated); err != nil {
		b.Fatal(err)
	}
	for _, conc := range []int{1, 8} {
		b.Run(fmt.Sprintf("first/c%d", conc), func(b *testing.B) {
			parallel(b, conc, func() error { return serve(fmt.Sprintf("k%d", seq.Add(1)), http.StatusCreated) })
		})
		b.Run(fmt.Sprintf("replay/c%d", conc), func(b *testing.B) {
			parallel(b, conc, func() error { return serve("replayed", http.StatusCreated) })
		})
	}
}

func parallel(b *testing.B, conc int, do func() error) {
	b.ReportAllocs()
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		failed  error
	)
	for range conc {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := do(); err != nil {
					errOnce.Do(func() { failed = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if failed != nil {
		b.Fatal(failed)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}
