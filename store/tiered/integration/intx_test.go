package tiered_test

import (
	"context"
	"github.com/idemkey/idemkey/claim"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/tiered"
)

// TestCompletedInTransaction: a handler completed the record in its own
// transaction on the Postgres backstop (CompleteTx) and committed; after
// NotifyCompleted the Redis marker has become the record, so the retry is a
// Redis-only replay. Without the notice Redis still answers in flight.
func TestCompletedInTransaction(t *testing.T) {
	shared := redistest.Shared(t)
	c := goredis.NewClient(shared.Options())
	t.Cleanup(func() { _ = c.Close() })
	pool := pgPool(t)
	pg := postgresBackstop(t, pool)
	back := &probe{Store: pg}
	s := mustTiered(t, mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, shared))), back, tiered.WithTimeout(testTimeout))
	ctx := t.Context()

	req := store.ClaimRequest{ID: store.ID{Scope: "t", Key: "k"}, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
	res, err := s.Claim(ctx, req)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Claim: %+v, %v", res, err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp := store.Response{Status: 201, Body: []byte("charged")}
	if err := pg.CompleteTx(ctx, tx, req.ID, res.Token, resp, req.Retention); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Claim(ctx, req); err != nil || got.Outcome != store.InFlight {
		t.Fatalf("before the notice: %+v, %v; want the Redis marker's in flight", got, err)
	}
	s.NotifyCompleted(ctx, req.ID, res.Token, resp, req.Retention)
	b0 := back.calls.Load()
	got, err := s.Claim(ctx, req)
	if err != nil || got.Outcome != store.Completed || string(got.Record.Body) != "charged" || back.calls.Load() != b0 {
		t.Fatalf("after the notice: %+v, %v, %d backstop calls; want a Redis replay", got, err, back.calls.Load()-b0)
	}
}

// TestPanicAfterCommitResponse: a handler behind the middleware commits its
// response in its own transaction (postgres CommitResponse) and then panics. The
// record is committed, so the middleware tells the tiered store: the retry is a
// Redis-only replay of the committed response, never a 409 from the Redis marker
// for the rest of the lease.
func TestPanicAfterCommitResponse(t *testing.T) {
	shared := redistest.Shared(t)
	c := goredis.NewClient(shared.Options())
	t.Cleanup(func() { _ = c.Close() })
	pool := pgPool(t)
	pg := postgresBackstop(t, pool)
	back := &probe{Store: pg}
	s := mustTiered(t, mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, shared))), back, tiered.WithTimeout(testTimeout))
	m, err := middleware.New(s, middleware.GlobalScope, middleware.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		tx, err := pool.Begin(r.Context())
		if err != nil {
			t.Error(err)
			return
		}
		if err := pg.CommitResponse(r.Context(), tx, w, store.Response{Status: 201, Body: []byte("charged")}); err != nil {
			t.Error(err)
			return
		}
		panic(http.ErrAbortHandler)
	}))
	func() {
		defer func() {
			if p := recover(); p != http.ErrAbortHandler {
				t.Fatalf("recovered %v, want the handler's panic", p)
			}
		}()
		r := httptest.NewRequest("POST", "/charges", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", "panic-1")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	b0 := back.calls.Load()
	r := httptest.NewRequest("POST", "/charges", strings.NewReader("x"))
	r.Header.Set("Idempotency-Key", "panic-1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 201 || w.Body.String() != "charged" || runs != 1 || back.calls.Load() != b0 {
		t.Fatalf("retry: %d %q after %d runs, %d backstop calls; want the committed response from Redis alone",
			w.Code, w.Body, runs, back.calls.Load()-b0)
	}
}

// TestOneTxTiered: a one-transaction route behind the tiered store. The first
// request commits its row and the record in one transaction, and the cache
// learns of the record after the commit: the retry is a Redis-only replay.
func TestOneTxTiered(t *testing.T) {
	shared := redistest.Shared(t)
	c := goredis.NewClient(shared.Options())
	t.Cleanup(func() { _ = c.Close() })
	pool := pgPool(t)
	pg := postgresBackstop(t, pool)
	ts, err := pg.OneTx(pool)
	if err != nil {
		t.Fatal(err)
	}
	back := &txProbe{probe: probe{Store: ts}, ts: ts}
	s := mustTiered(t, mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, shared))), back, tiered.WithTimeout(testTimeout))
	m, err := middleware.New(s, middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := m.OneTx(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		tx, ok := postgres.TxFromContext(r.Context())
		if !ok {
			t.Error("no transaction")
			return
		}
		var n int
		// The route's record is written once, at completion, with the response: the
		// handler's transaction holds the key's lock but no row yet.
		if err := tx.QueryRow(r.Context(), "SELECT count(*) FROM "+pg.Table()).Scan(&n); err != nil || n != 0 {
			t.Errorf("the transaction sees %d records (%v), want none before completion", n, err)
		}
		w.WriteHeader(201)
		w.Write([]byte("ordered"))
	}))
	post := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/orders", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", "onetx-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := post(); w.Code != 201 || w.Body.String() != "ordered" {
		t.Fatalf("first: %d %q", w.Code, w.Body)
	}
	b0 := back.calls.Load()
	w := post()
	if w.Code != 201 || w.Body.String() != "ordered" || w.Header().Get("Idempotent-Replayed") != "true" || runs != 1 || back.calls.Load() != b0 {
		t.Fatalf("retry: %d %q after %d runs, %d backstop calls; want the committed response from Redis alone",
			w.Code, w.Body, runs, back.calls.Load()-b0)
	}
}

// txProbe is a probe over a store that holds claims in transactions.
type txProbe struct {
	probe
	ts claim.TxStore
}

func (p *txProbe) ClaimTx(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, claim.Tx, error) {
	p.calls.Add(1)
	return p.ts.ClaimTx(ctx, req)
}
