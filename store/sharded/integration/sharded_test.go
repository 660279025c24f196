package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/sharded"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestConformanceTwoDatabases runs the whole suite over two Postgres databases,
// scopes routed by hash.
func TestConformanceTwoDatabases(t *testing.T) {
	dbs := databases(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		a, _ := shardStore(t, dbs[0])
		b, _ := shardStore(t, dbs[1])
		s, err := sharded.NewHashed(a, b)
		if err != nil {
			t.Fatal(err)
		}
		return storetest.Subject{Store: s}
	})
}

// TestWaitingTwoDatabases: waiting duplicates are woken by the LISTEN of their
// tenant's database.
func TestWaitingTwoDatabases(t *testing.T) {
	dbs := databases(t)
	storetest.RunWaiting(t, func(t *testing.T) storetest.WaitSubject {
		a, _ := shardStore(t, dbs[0], postgres.WithWaiterIdle(0))
		b, _ := shardStore(t, dbs[1], postgres.WithWaiterIdle(0))
		s, err := sharded.NewHashed(a, b)
		if err != nil {
			t.Fatal(err)
		}
		return storetest.WaitSubject{Store: s, Waiting: func() int { return int(a.Stats().Waiters + b.Stats().Waiters) }}
	})
}

// rowsByScope counts the records of each scope in one shard's table.
func rowsByScope(t *testing.T, pool *pgxpool.Pool, schema string) map[string]int {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT convert_from(scope, 'UTF8'), count(*) FROM "+
		pgx.Identifier{schema, postgres.DefaultTable}.Sanitize()+" GROUP BY scope")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var scope string
		var n int
		if err := rows.Scan(&scope, &n); err != nil {
			t.Fatal(err)
		}
		got[scope] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestTenantRecordsStayInTheirDatabase: tenants homed by the application's table
// (and the rest by hash) have every record in their own database: claims,
// completions, releases and inspections of one tenant never touch the other
// database, whose table holds none of its rows.
func TestTenantRecordsStayInTheirDatabase(t *testing.T) {
	dbs := databases(t)
	a, schemaA := shardStore(t, dbs[0])
	b, schemaB := shardStore(t, dbs[1])
	home := map[string]store.Store{"acme": a, "globex": b}
	hashed := sharded.ByHash(a, b)
	s, err := sharded.New(func(scope string) store.Store {
		if sh, ok := home[scope]; ok {
			return sh
		}
		return hashed(scope)
	}, a, b)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	tenants := []string{"acme", "globex"}
	for i := range 20 {
		tenants = append(tenants, fmt.Sprintf("tenant-%d", i))
	}
	for _, scope := range tenants {
		for k := range 3 {
			id := store.ID{Scope: scope, Key: fmt.Sprintf("k%d", k)}
			r, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour})
			if err != nil || r.Outcome != store.Claimed {
				t.Fatalf("claim %v: %+v %v", id, r, err)
			}
			switch k {
			case 0:
				err = s.Complete(ctx, id, r.Token, store.Response{Status: 201}, time.Hour)
			case 1:
				err = s.Renew(ctx, id, r.Token, time.Minute)
			case 2:
				err = s.Release(ctx, id, r.Token)
			}
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Inspect(ctx, id)
			if want := []store.State{store.StateCompleted, store.StateInFlight, store.StateAbsent}[k]; err != nil || info.State != want {
				t.Fatalf("inspect %v: %v %v, want %v", id, info.State, err, want)
			}
		}
	}
	inA, inB := rowsByScope(t, dbs[0], schemaA), rowsByScope(t, dbs[1], schemaB)
	for _, scope := range tenants {
		want, _ := s.Shard(scope)
		here, there := inA, inB
		if want == store.Store(b) {
			here, there = inB, inA
		}
		if here[scope] != 2 || there[scope] != 0 {
			t.Errorf("%s: %d records in its database, %d in the other; want 2 and 0", scope, here[scope], there[scope])
		}
	}
	if inA["acme"] != 2 || inB["globex"] != 2 {
		t.Errorf("the homed tenants are not in their databases: %v / %v", inA, inB)
	}
	if len(inA) < 3 || len(inB) < 3 {
		t.Errorf("the hash put %d tenants in one database and %d in the other", len(inA), len(inB))
	}
}

// TestCompleteTxInTheTenantDatabase: behind the middleware, a handler writes its
// charge and completes the record in one transaction on its tenant's database
// (the shard's CompleteTx). The charge and the record land in that database
// only, and the retry replays the committed response.
func TestCompleteTxInTheTenantDatabase(t *testing.T) {
	dbs := databases(t)
	a, schemaA := shardStore(t, dbs[0])
	b, schemaB := shardStore(t, dbs[1])
	pools := map[store.Store]*pgxpool.Pool{a: dbs[0], b: dbs[1]}
	schemas := map[store.Store]string{a: schemaA, b: schemaB}
	for _, sh := range []store.Store{a, b} {
		if _, err := pools[sh].Exec(t.Context(), "CREATE TABLE "+pgx.Identifier{schemas[sh], "charges"}.Sanitize()+" (tenant text, key text)"); err != nil {
			t.Fatal(err)
		}
	}
	s, err := sharded.NewHashed(a, b)
	if err != nil {
		t.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		cl, _ := claim.FromContext(ctx)
		sh, err := s.Shard(cl.ID.Scope)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		tx, err := pools[sh].Begin(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		_, err = tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{schemas[sh], "charges"}.Sanitize()+" VALUES ($1, $2)", cl.ID.Scope, cl.ID.Key)
		resp := store.Response{Status: 201, Body: []byte("charged " + cl.ID.Scope)}
		if err == nil {
			err = sh.(*postgres.Store).CompleteTx(ctx, tx, cl.ID, cl.Token, resp, cl.Retention)
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err == nil {
			err = claim.MarkCompleted(ctx, resp)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(resp.Status)
		_, _ = w.Write(resp.Body)
	})
	mw, err := middleware.New(s, middleware.ScopeFromHeader("X-Tenant", "anonymous"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(handler))
	t.Cleanup(srv.Close)
	send := func(tenant string) (int, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader(`{"cents":100}`))
		req.Header.Set("Idempotency-Key", "charge-1")
		req.Header.Set("X-Tenant", tenant)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}
	tenants := []string{"acme", "globex", "initech", "umbrella", "hooli", "wayne"}
	for _, tenant := range tenants {
		for try := range 2 { // the first runs, the retry replays
			if code, body := send(tenant); code != 201 || body != "charged "+tenant {
				t.Fatalf("%s, try %d: %d %q", tenant, try, code, body)
			}
		}
	}
	for _, tenant := range tenants {
		home, _ := s.Shard(tenant)
		for _, sh := range []store.Store{a, b} {
			var charges, records int
			err := pools[sh].QueryRow(t.Context(), "SELECT (SELECT count(*) FROM "+pgx.Identifier{schemas[sh], "charges"}.Sanitize()+
				" WHERE tenant = $1), (SELECT count(*) FROM "+pgx.Identifier{schemas[sh], postgres.DefaultTable}.Sanitize()+
				" WHERE scope = convert_to($1, 'UTF8') AND status = 201)", tenant).Scan(&charges, &records)
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			if sh == home {
				want = 1
			}
			if charges != want || records != want {
				t.Errorf("%s: %d charges and %d completed records in a database where %d belong", tenant, charges, records, want)
			}
		}
	}
}
