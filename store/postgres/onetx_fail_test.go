package postgres

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// TestOneTxCommitFails: the handler's rows break a deferred constraint, so the
// COMMIT behind the completion fails. Nothing commits (no row, no record), the
// client gets 503 store_unavailable instead of the handler's 201, and the retry
// runs.
func TestOneTxCommitFails(t *testing.T) {
	var mu sync.Mutex
	twice := true
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			tx, _ := TxFromContext(r.Context())
			mu.Lock()
			n := 1
			if twice {
				n = 2
			}
			mu.Unlock()
			for range n {
				if _, err := tx.Exec(r.Context(), `INSERT INTO `+e.side+` (key, n) VALUES ('k', 7)`); err != nil {
					http.Error(w, err.Error(), 500)
					return
				}
			}
			w.WriteHeader(201)
			w.Write([]byte("created"))
		}
	}, nil)
	if _, err := e.pool.Exec(t.Context(), `ALTER TABLE `+e.side+` ADD CONSTRAINT one_n UNIQUE (n) DEFERRABLE INITIALLY DEFERRED`); err != nil {
		t.Fatal(err)
	}
	code, h, body, err := e.post("fail-1")
	if err != nil || code != 503 || h.Get("Retry-After") != "1" || !strings.Contains(body, `"code":"store_unavailable"`) {
		t.Fatalf("failed commit answered %d %q (Retry-After %q) %v; want 503 store_unavailable", code, body, h.Get("Retry-After"), err)
	}
	var records int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM `+e.st.Table()).Scan(&records); err != nil {
		t.Fatal(err)
	}
	if rows, _, _ := e.counts(); rows != 0 || records != 0 {
		t.Fatalf("%d rows, %d records after the failed commit; want none", rows, records)
	}
	mu.Lock()
	twice = false
	mu.Unlock()
	if code, h, body, err := e.post("fail-1"); err != nil || code != 201 || body != "created" || h.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %d %q %v; want a fresh 201", code, body, err)
	}
}

// claimCounter counts the claims of the requests (a StoreObserver).
type claimCounter struct {
	claims atomic.Int32
	second chan struct{} // closed at the second claim
	once   sync.Once
}

func (c *claimCounter) Observe(context.Context, middleware.Event) {}

func (c *claimCounter) StoreCallStart(ctx context.Context, op middleware.StoreOp, _ store.ID) (context.Context, func(error)) {
	if op == middleware.StoreClaim && c.claims.Add(1) == 3 { // the first's, the duplicate's, its claim again
		c.once.Do(func() { close(c.second) })
	}
	return ctx, nil
}

// TestOneTxWaitInFlight: with WithWaitInFlight longer than the lock wait, a
// duplicate whose lock wait ran out claims again (waiting on the lock again)
// and gets the replay once the first commits.
func TestOneTxWaitInFlight(t *testing.T) {
	counter := &claimCounter{second: make(chan struct{})}
	entered, proceed := make(chan struct{}, 2), make(chan struct{})
	e := newOneTxEnv(t, nil, heldInsert(entered, proceed), []TxOption{WithLockWait(50 * time.Millisecond)},
		middleware.WithWaitInFlight(20*time.Second), middleware.WithObserver(counter))
	type answer struct {
		code           int
		replayed, body string
		err            error
	}
	send := func() chan answer {
		c := make(chan answer, 1)
		go func() {
			code, h, body, err := e.post("wait-1")
			c <- answer{code, h.Get("Idempotent-Replayed"), body, err}
		}()
		return c
	}
	first := send()
	<-entered
	dup := send()
	<-counter.second // the duplicate's lock wait ran out and it claims again
	close(proceed)
	a, b := <-first, <-dup
	if a.err != nil || a.code != 201 || b.err != nil || b.code != 201 || b.replayed != "true" || b.body != a.body {
		t.Fatalf("first %+v, duplicate %+v; want 201 and its replay", a, b)
	}
}

// TestOneTxRecordTamperedWith: a handler that writes a record for its own key
// in the transaction makes the completion's insert fail, so the COMMIT behind
// it never runs: no row without a record, and the client gets 503.
func TestOneTxRecordTamperedWith(t *testing.T) {
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		inner := insertInTx(e)
		return func(w http.ResponseWriter, r *http.Request) {
			tx, _ := TxFromContext(r.Context())
			if _, err := tx.Exec(r.Context(), `INSERT INTO `+e.st.Table()+` (scope, key, fingerprint, token, created_at, expires_at)
VALUES ('', 'tamper-1', '', '', now(), now() + interval '1 hour')`); err != nil {
				t.Error(err)
			}
			inner(w, r)
		}
	}, nil)
	if code, _, body, err := e.post("tamper-1"); err != nil || code != 503 {
		t.Fatalf("answered %d %q %v; want 503", code, body, err)
	}
	if rows, _, records := e.counts(); rows != 0 || records != 0 {
		t.Fatalf("%d rows, %d records; want none", rows, records)
	}
}

// TestOneTxBesideDefaultRoutes: one TxStore serves a one-transaction route and
// a default route side by side; the default route claims, completes and
// replays as on the plain Store, and its handler gets no transaction.
func TestOneTxBesideDefaultRoutes(t *testing.T) {
	pool := newPool(t, "")
	_, m := oneTxMiddleware(t, newStore(t, pool, nil), pool, nil)
	runs := 0
	mux := http.NewServeMux()
	mux.Handle("POST /plain", m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		if _, ok := TxFromContext(r.Context()); ok {
			t.Error("a transaction on a default route")
		}
		w.WriteHeader(201)
		w.Write([]byte("plain"))
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	for i := range 2 {
		r, _ := http.NewRequest("POST", srv.URL+"/plain", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", "plain-1")
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 201 || (i == 1) != (resp.Header.Get("Idempotent-Replayed") == "true") || runs != 1 {
			t.Fatalf("request %d: %d replayed=%q after %d runs", i, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), runs)
		}
	}
}

// TestOneTxExpiredRecord: a record past its retention is a new key again: the
// first attempt's insert meets it and does nothing, the next attempt takes it
// over, and the handler runs a second time.
func TestOneTxExpiredRecord(t *testing.T) {
	e := newOneTxEnv(t, nil, insertInTx, nil)
	code, _, first, err := e.post("expired-1")
	if err != nil || code != 201 {
		t.Fatal(code, err)
	}
	if _, err := e.pool.Exec(t.Context(), `UPDATE `+e.st.Table()+` SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	code, h, second, err := e.post("expired-1")
	if err != nil || code != 201 || h.Get("Idempotent-Replayed") != "" || second == first {
		t.Fatalf("after expiry: %d %q replayed=%q %v; want a fresh 201", code, second, h.Get("Idempotent-Replayed"), err)
	}
	if rows, _, records := e.counts(); rows != 2 || records != 1 {
		t.Fatalf("%d rows, %d records; want 2 and 1", rows, records)
	}
}

// renewCounter is a TxStore that signals its renewals.
type renewCounter struct {
	*TxStore
	renewed chan struct{}
}

func (r *renewCounter) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	err := r.TxStore.Renew(ctx, id, tok, lease)
	select {
	case r.renewed <- struct{}{}:
	default:
	}
	return err
}

// TestOneTxOutlivesLease: a handler that runs for several leases keeps its
// transaction (the transaction holds the key: nothing is renewed, nothing
// lost, so the handler's context is not cancelled) and commits once.
func TestOneTxOutlivesLease(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	side := sideTable(t, pool, s, "")
	ts, err := s.OneTx(pool)
	if err != nil {
		t.Fatal(err)
	}
	rc := &renewCounter{TxStore: ts, renewed: make(chan struct{}, 1)}
	m, err := middleware.New(rc, middleware.GlobalScope, middleware.WithLease(claim.MinLease))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.OneTx(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(3 * claim.MinLease):
		case <-r.Context().Done():
			t.Error("the handler's context was cancelled")
		}
		tx, _ := TxFromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+side+` (key) VALUES ('long')`); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(201)
	})))
	t.Cleanup(srv.Close)
	req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "long-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || countRows(t, pool, side) != 1 {
		t.Fatalf("answered %d with %d rows; want 201 and 1", resp.StatusCode, countRows(t, pool, side))
	}
	select {
	case <-rc.renewed:
		t.Fatal("a renewal of a claim its transaction holds")
	default:
	}
}
