package postgres

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// The situations of docs/architecture.md section 9, over real TCP against a real
// Postgres: each would run the handler twice without its part of the middleware.

// TestHangUpRunsOnce: the client hangs up while the handler (which inserts its
// row in its own transaction) runs; the handler finishes, and the retry replays
// its response: one row, one execution.
func TestHangUpRunsOnce(t *testing.T) {
	entered, proceed := make(chan struct{}, 1), make(chan struct{})
	var runs atomic.Int32
	e := newTxEnv(t, func(e *txEnv) http.HandlerFunc {
		inner := insertAndCommit(e)
		return func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			entered <- struct{}{}
			<-proceed
			inner(w, r)
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		r, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/charges", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", `"hang-1"`)
		_, err := http.DefaultClient.Do(r)
		errc <- err
	}()
	<-entered
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the hung-up request succeeded")
	}
	close(proceed)
	if ev := <-e.events; ev.Decision != middleware.Executed || !ev.InTransaction {
		t.Fatalf("event %+v, want executed in transaction", ev)
	}
	code, h, body := e.post(`"hang-1"`, "x")
	if code != 201 || body != `{"key":"hang-1"}` || h.Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("retry: %d %q replayed=%q after %d runs; want the replay, 1 run", code, body, h.Get("Idempotent-Replayed"), runs.Load())
	}
	if n := countRows(t, e.pool, e.side); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

// failingComplete fails the first n Complete calls with a store error.
type failingComplete struct {
	*Store
	fails, calls atomic.Int32
}

func (f *failingComplete) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	f.calls.Add(1)
	if f.fails.Add(-1) >= 0 {
		return fmt.Errorf("idemkey/store/postgres: complete: %w", context.DeadlineExceeded)
	}
	return f.Store.Complete(ctx, id, tok, resp, ret)
}

// TestCompleteFailsTwiceThenSucceeds: the store fails the completion twice after
// the handler ran; the middleware retries while the lease is held, so there is
// one execution and the replay is the original response.
func TestCompleteFailsTwiceThenSucceeds(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	fc := &failingComplete{Store: s}
	fc.fails.Store(2)
	var runs atomic.Int32
	m, err := middleware.New(fc, middleware.GlobalScope, middleware.WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "run %d", runs.Add(1))
	})))
	defer srv.Close()
	post := func() (int, string, string) {
		r, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", "k")
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed")
	}
	if code, body, _ := post(); code != 200 || body != "run 1" {
		t.Fatalf("first: %d %q", code, body)
	}
	for fc.calls.Load() < 3 { // the retries may still run after the response reached the client
		runtime.Gosched()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body, replayed := post()
		if code == 200 && body == "run 1" && replayed == "true" {
			break
		}
		if code != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("retry: %d %q; want 409 until the record is complete, then the original", code, body)
		}
	}
	if runs.Load() != 1 || fc.calls.Load() != 3 {
		t.Fatalf("%d runs, %d Complete calls; want 1, 3", runs.Load(), fc.calls.Load())
	}
}

// TestHungPostgres stops the private cluster with SIGSTOP (a hung, not a dead,
// server): every claim answers 503 store_unavailable with Retry-After within the
// claim bound, the handler never runs, and once the requests are done no goroutine
// or connection is left behind. After SIGCONT the service resumes.
func TestHungPostgres(t *testing.T) {
	c := startCluster(t)
	pool := newPool(t, c.url(), func(cfg *pgxpool.Config) { cfg.MaxConns = 4 })
	s, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	const bound = time.Second
	var runs atomic.Int32
	m, err := middleware.New(s, middleware.GlobalScope, middleware.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: bound}}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.WriteString(w, "ok")
	})))
	defer srv.Close()
	client := &http.Client{Timeout: 30 * time.Second}
	post := func(key string) (int, string) {
		r, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	if code, _ := post("warm"); code != 200 { // connections open and idle
		t.Fatalf("warm-up: %d", code)
	}
	runs.Store(0)
	client.CloseIdleConnections()
	goroutines, conns := runtime.NumGoroutine(), pool.Stat().TotalConns()

	c.Signal(t, syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			c.Signal(t, syscall.SIGCONT)
		}
	}()
	const requests = 6
	type answer struct {
		code  int
		ra    string
		taken time.Duration
	}
	answers := make(chan answer, requests)
	for i := range requests {
		go func() {
			t0 := time.Now()
			code, ra := post(fmt.Sprintf("hung-%d", i))
			answers <- answer{code, ra, time.Since(t0)}
		}()
	}
	var slowest time.Duration
	for range requests {
		a := <-answers
		if a.code != http.StatusServiceUnavailable || a.ra == "" {
			t.Fatalf("claim against a hung store: %d Retry-After %q, want 503 with Retry-After", a.code, a.ra)
		}
		slowest = max(slowest, a.taken)
	}
	if slowest > bound+time.Second || runs.Load() != 0 {
		t.Fatalf("slowest 503 after %v (bound %v), handler ran %d times", slowest, bound, runs.Load())
	}
	client.CloseIdleConnections()
	// pgx closes a connection whose query timed out in the background; wait for it.
	var g int
	leakDeadline := time.Now().Add(20 * time.Second)
	for {
		g = runtime.NumGoroutine()
		if g <= goroutines+2 && pool.Stat().AcquiredConns() == 0 || time.Now().After(leakDeadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // background closes on the real clock
	}
	if g > goroutines+2 {
		buf := make([]byte, 1<<16)
		t.Fatalf("goroutines %d before the hang, %d after its requests ended\n%s", goroutines, g, buf[:runtime.Stack(buf, true)])
	}
	t.Logf("SIGSTOP: %d requests answered 503 within %v (bound %v); goroutines %d before, %d after; pool connections %d before, %d after (%d acquired) %v after the last answer",
		requests, slowest, bound, goroutines, g, conns, pool.Stat().TotalConns(), pool.Stat().AcquiredConns(), time.Until(leakDeadline.Add(-20*time.Second)).Abs())
	if pool.Stat().AcquiredConns() != 0 {
		t.Fatalf("%d connections still acquired", pool.Stat().AcquiredConns())
	}

	c.Signal(t, syscall.SIGCONT)
	stopped = false
	resumeDeadline := time.Now().Add(20 * time.Second)
	for {
		code, _ := post("after")
		if code == 200 {
			break
		}
		if time.Now().After(resumeDeadline) {
			t.Fatalf("after SIGCONT: %d", code)
		}
	}
	if code, _ := post("after"); code != 200 || runs.Load() != 1 {
		t.Fatalf("replay after SIGCONT: %d, %d runs", code, runs.Load())
	}
}
