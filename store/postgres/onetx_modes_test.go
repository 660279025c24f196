package postgres

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
)

// TestOneTxStormExecModes: concurrent copies of many keys on a one-transaction
// route, in each of pgx's query exec modes (through PgBouncer in transaction
// mode too, in the two modes it supports), the holder committing at random
// instants (no delay, or a pg_sleep under 1 ms): every copy is answered with the
// first execution's response (201, replayed or not), or 409; the handler runs
// once per key. A claim whose tried lock succeeds reads in the same batch, so
// this holds only if each statement of the batch (one multi-statement query
// in the simple protocol) reads with a snapshot taken when it starts.
func TestOneTxStormExecModes(t *testing.T) {
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	for _, via := range []string{"direct", "pgbouncer"} {
		for _, mode := range modes {
			bounced := via == "pgbouncer"
			if bounced && mode != pgx.QueryExecModeExec && mode != pgx.QueryExecModeSimpleProtocol {
				continue // a transaction pooler breaks pgx's prepared statements
			}
			t.Run(via+"/"+mode.String(), func(t *testing.T) {
				url := ""
				if bounced {
					url = os.Getenv("PGBOUNCER_URL")
					pgbouncerPool(t) // skips (or fails under CI=true) without PGBOUNCER_URL
				}
				stormExecMode(t, url, mode)
			})
		}
	}
}

// stormExecMode runs TestOneTxStormExecModes's storm on url (DATABASE_URL when
// empty) with the route's pool in mode.
func stormExecMode(t *testing.T, url string, mode pgx.QueryExecMode) {
	const keys, copies = 80, 6
	admin := newPool(t, "")
	pool := newPool(t, url, func(c *pgxpool.Config) { c.MaxConns = 16; c.ConnConfig.DefaultQueryExecMode = mode })
	s := newStore(t, admin, pool)
	side := sideTable(t, admin, s, "")
	ts, m := oneTxMiddleware(t, s, pool, []TxOption{WithLockWait(20 * time.Second)},
		middleware.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: 45 * time.Second}}))
	e := &oneTxEnv{t: t, pool: admin, st: s, ts: ts, side: side,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	inner := insertInTx(e)
	srv := httptest.NewServer(m.OneTx(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if us := rand.IntN(2000) - 1000; us > 0 { // half the holders commit at once
			tx, _ := TxFromContext(r.Context())
			if _, err := tx.Exec(r.Context(), `SELECT pg_sleep($1)`, float64(us)/1e6); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
		}
		inner(w, r)
	})))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	answers := e.storm("modes", keys, copies, 32)
	for k, a := range answers {
		var first string
		for _, x := range a {
			if strings.HasPrefix(x, "first ") {
				if first != "" {
					t.Fatalf("key %d: two first executions, %q and %q", k, first, x)
				}
				first = strings.TrimPrefix(x, "first ")
			}
		}
		for c, x := range a {
			if x = strings.TrimPrefix(x, "first "); x != first && !strings.HasPrefix(x, "409 ") {
				t.Fatalf("key %d: copy %d answered %q; want the first execution's %q, or 409", k, c, x, first)
			}
		}
	}
	if rows, distinct, records := e.counts(); rows != keys || distinct != keys || records != keys {
		t.Fatalf("%d rows over %d keys, %d records; want %d of each", rows, distinct, records, keys)
	}
}
