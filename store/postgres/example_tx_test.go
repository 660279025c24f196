package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// ExampleStore_CommitResponse completes the idempotency record inside the
// handler's own transaction: the charge row and the record commit together, so a
// crash can never leave one without the other, and a handler whose lease was taken
// over cannot commit its charge (CommitResponse returns store.ErrLeaseLost and rolls
// back). It needs a server (DATABASE_URL; it uses a schema of its own and drops it),
// so go test compiles it without running it (a test without Postgres must skip, and
// an example cannot); TestCommitResponseThroughMiddleware tests the same flow.
func ExampleStore_CommitResponse() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := "idemkey_example_" + store.NewToken().String()[:8] // yours: a fixed name
	charges := pgx.Identifier{schema, "charges"}.Sanitize()
	st, err := postgres.New(pool, postgres.WithSchema(schema))
	if err != nil {
		log.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	if _, err := pool.Exec(ctx, `CREATE TABLE `+charges+` (id bigserial PRIMARY KEY, cents int NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	charge := func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := pool.Begin(ctx)
		if err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback(ctx) // a no-op once committed
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO `+charges+` (cents) VALUES (500) RETURNING id`).Scan(&id); err != nil {
			http.Error(w, "database error", http.StatusInternalServerError)
			return
		}
		resp := store.Response{
			Status: http.StatusCreated,
			Header: http.Header{"Content-Type": {"application/json"}},
			Body:   fmt.Appendf(nil, `{"charge":%d}`, id),
		}
		switch err := st.CommitResponse(ctx, tx, w, resp); {
		case errors.Is(err, store.ErrLeaseLost): // a retry took the key over; nothing committed
			http.Error(w, "superseded by a retry", http.StatusConflict)
		case err != nil: // 5xx: the middleware releases the claim (fenced)
			http.Error(w, "charge failed", http.StatusServiceUnavailable)
		}
	}

	m, err := middleware.New(st, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(charge)))
	defer srv.Close()
	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader(`{"cents":500}`))
		req.Header.Set("Idempotency-Key", `"charge-1"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body))
	}
	var n int
	pool.QueryRow(ctx, `SELECT count(*) FROM `+charges).Scan(&n)
	fmt.Println("charges:", n)
	// It prints:
	//	201  {"charge":1}
	//	201 true {"charge":1}
	//	charges: 1
}
