// Command quickstart is the README's Postgres program, kept compiling.
package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/postgres"
)

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // e.g. postgres://postgres@127.0.0.1:5432/postgres
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	pg, err := postgres.New(pool) // records in the table idemkey_records
	if err != nil {
		log.Fatal(err)
	}
	if err := pg.Migrate(ctx); err != nil { // or apply pg.MigrationSQL() with your migration tool
		log.Fatal(err)
	}
	stopSweeper := pg.StartSweeper(ctx, time.Minute) // deletes expired records in small batches
	defer stopSweeper()                              // waits for a sweep under way
	defer pg.StopWaiters()                           // closes the connection that wakes waiting duplicates

	m, err := middleware.New(pg, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		id, _ := middleware.KeyFromContext(r.Context())
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "payment %s charged once\n", id.Key)
	})
	srv := &http.Server{Addr: "127.0.0.1:8081", Handler: m.Handler(mux)}
	go func() {
		<-ctx.Done() // Ctrl-C: finish the requests in flight, then the deferred stops run
		shutdown, done := context.WithTimeout(context.Background(), 10*time.Second)
		defer done()
		srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
