package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// ExampleStore_OneTx runs a route in one transaction: the claim, the order row
// and the idempotency record commit together, once. The handler takes the
// transaction from its context and answers as usual; the retry replays the
// committed answer. It needs a server (DATABASE_URL; it uses a schema of its
// own and drops it), so go test compiles it without running it (an example
// cannot skip); TestExampleStore_OneTx runs it when DATABASE_URL is set.
func ExampleStore_OneTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := "idemkey_example_" + store.NewToken().String()[:8] // yours: a fixed name
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	st, err := postgres.New(pool, postgres.WithSchema(schema))
	if err != nil {
		log.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	if _, err := pool.Exec(ctx, `CREATE TABLE `+orders+` (id bigserial PRIMARY KEY, cents int NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	order := func(w http.ResponseWriter, r *http.Request) {
		tx, ok := postgres.TxFromContext(r.Context())
		if !ok {
			http.Error(w, "not a one-transaction route", http.StatusInternalServerError)
			return
		}
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO `+orders+` (cents) VALUES (500) RETURNING id`).Scan(&id); err != nil {
			http.Error(w, "database error", http.StatusInternalServerError) // 5xx: all rolled back
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, id)
	}

	ts, err := st.OneTx(pool)
	if err != nil {
		log.Fatal(err)
	}
	m, err := middleware.New(ts, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", m.OneTx(http.HandlerFunc(order)))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(`{"cents":500}`))
		req.Header.Set("Idempotency-Key", `"order-1"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body))
	}
	var n int
	pool.QueryRow(ctx, `SELECT count(*) FROM `+orders).Scan(&n)
	fmt.Println("orders:", n)
	// (no Output: it needs a server; TestExampleStore_OneTx runs it)
	//   201  {"order":1}
	//   201 true {"order":1}
	//   orders: 1
}

// TestExampleStore_OneTx runs ExampleStore_OneTx against DATABASE_URL and checks
// what it prints.
func TestExampleStore_OneTx(t *testing.T) {
	runServerExample(t, ExampleStore_OneTx, "201  {\"order\":1}\n201 true {\"order\":1}\norders: 1\n")
}
