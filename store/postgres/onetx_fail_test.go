package postgres

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		inner := insertInTx(e)
		return func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-proceed
			inner(w, r)
		}
	}, []TxOption{WithLockWait(50 * time.Millisecond)},
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
