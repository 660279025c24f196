package postgres

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// BenchmarkInTxCompletion compares the first execution of a handler that inserts
// its row in its own transaction and then lets the middleware Complete the record
// ("ordinary") with the same handler completing the record inside its transaction
// (CommitResponse, "in-transaction"). stmts/op counts every statement pgx sends
// (claim, BEGIN, INSERT, completion, COMMIT); each is one round trip.
//
//	go test -run '^$' -bench InTxCompletion -count 6 ./store/postgres/
func BenchmarkInTxCompletion(b *testing.B) {
	tracer := &countingTracer{}
	admin := newPool(b, "")
	pool := newPool(b, "", func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	s := newStore(b, admin, pool)
	side := sideTable(b, admin, s, "")
	m, err := middleware.New(s, middleware.GlobalScope)
	if err != nil {
		b.Fatal(err)
	}
	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":true}`)}
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"ordinary", func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			tx, err := pool.Begin(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			if _, err := tx.Exec(ctx, `INSERT INTO `+side+` (key) VALUES ('x')`); err != nil {
				b.Error(err)
				return
			}
			if err := tx.Commit(ctx); err != nil {
				b.Error(err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(201)
			w.Write(resp.Body)
		}},
		{"in-transaction", func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			tx, err := pool.Begin(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			if _, err := tx.Exec(ctx, `INSERT INTO `+side+` (key) VALUES ('x')`); err != nil {
				b.Error(err)
				return
			}
			if err := s.CommitResponse(ctx, tx, w, resp); err != nil {
				b.Error(err)
			}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h := m.Handler(tc.handler)
			i := 0
			tracer.take()
			for b.Loop() {
				i++
				r := httptest.NewRequest("POST", "/charges", strings.NewReader("x"))
				r.Header.Set("Idempotency-Key", tc.name+"-"+strconv.Itoa(i)+"-"+store.NewToken().String()[:8])
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != 201 {
					b.Fatalf("%d %s", w.Code, w.Body)
				}
			}
			b.ReportMetric(float64(tracer.take())/float64(i), "stmts/op")
		})
	}
}
