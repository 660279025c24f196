// Command readme is the docs' in-transaction snippet (docs/stores.md), kept compiling.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	pg, err := postgres.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	if err := pg.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, cents int NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	m, err := middleware.New(pg, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /charges", m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context() // the request's: it carries the claim CommitResponse completes
		tx, err := pool.Begin(ctx)
		if err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback(ctx) // a no-op once committed
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO charges (cents) VALUES (500) RETURNING id`).Scan(&id); err != nil {
			http.Error(w, "database error", http.StatusInternalServerError)
			return
		}
		h := http.Header{"Content-Type": {"application/json"}}
		body := fmt.Appendf(nil, `{"charge":%d}`, id)
		err = pg.CommitResponse(ctx, tx, w, store.Response{Status: http.StatusCreated, Header: h, Body: body})
		switch {
		case errors.Is(err, store.ErrLeaseLost): // a retry took the key over; nothing committed
			http.Error(w, "superseded by a retry", http.StatusConflict)
		case err != nil: // postgres.ErrCommitUnknown, ...: nothing was written to w
			http.Error(w, "charge failed", http.StatusServiceUnavailable)
		}
	})))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}
