package redis_test

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

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// TestHungRedisThroughMiddleware stops a private Redis with SIGSTOP: every claim
// answers 503 store_unavailable with Retry-After within the middleware's claim
// bound (not the client's 3 s read timeout), the handler never runs, no goroutine
// is left behind, and after SIGCONT the service resumes.
func TestHungRedisThroughMiddleware(t *testing.T) {
	srv := redistest.StartServer(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 4})
	t.Cleanup(func() { _ = c.Close() })
	const bound = 500 * time.Millisecond
	var runs atomic.Int32
	m, err := middleware.New(redis.New(c), middleware.GlobalScope, middleware.WithStoreFailure(middleware.StoreFailureRule{Timeouts: middleware.StoreTimeouts{Claim: bound}}))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.WriteString(w, "ok")
	})))
	defer hs.Close()
	client := &http.Client{Timeout: 30 * time.Second}
	post := func(key string) (int, string) {
		r, _ := http.NewRequest("POST", hs.URL+"/x", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	if code, _ := post("warm"); code != 200 {
		t.Fatalf("warm-up: %d", code)
	}
	runs.Store(0)
	client.CloseIdleConnections()
	goroutines := runtime.NumGoroutine()

	pid := srv.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	const requests = 6
	taken := make(chan time.Duration, requests)
	for i := range requests {
		go func() {
			t0 := time.Now()
			if code, ra := post(fmt.Sprintf("hung-%d", i)); code != http.StatusServiceUnavailable || ra == "" {
				t.Errorf("claim against a hung Redis: %d Retry-After %q, want 503", code, ra)
			}
			taken <- time.Since(t0)
		}()
	}
	var slowest time.Duration
	for range requests {
		slowest = max(slowest, <-taken)
	}
	if slowest > bound+time.Second || runs.Load() != 0 {
		t.Fatalf("slowest 503 after %v (bound %v), handler ran %d times", slowest, bound, runs.Load())
	}
	client.CloseIdleConnections()
	var g int
	for deadline := time.Now().Add(10 * time.Second); ; {
		if g = runtime.NumGoroutine(); g <= goroutines+2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // connections close on the real clock
	}
	if g > goroutines+2 {
		t.Fatalf("goroutines %d before the hang, %d after its requests ended", goroutines, g)
	}
	t.Logf("SIGSTOP: %d requests answered 503 within %v (bound %v); goroutines %d before, %d after; pool %+v",
		requests, slowest, bound, goroutines, g, *c.PoolStats())

	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	for deadline := time.Now().Add(10 * time.Second); ; {
		code, _ := post("after")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGCONT: %d", code)
		}
	}
	if code, _ := post("after"); code != 200 || runs.Load() != 1 {
		t.Fatalf("replay after SIGCONT: %d, %d runs", code, runs.Load())
	}
}

// TestRedisHungWhileHandlerRuns stops a private Redis with SIGSTOP after the
// claim, while the handler runs: the handler finishes, its completion times out
// and is retried while the lease is held, and gives up within about one lease
// (the renewals time out too), so the client gets the handler's whole answer
// then, not never. After SIGCONT the store answers again (409 while the lease
// lives, a new run after it: at most once per lease).
func TestRedisHungWhileHandlerRuns(t *testing.T) {
	srv := redistest.StartServer(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 4})
	t.Cleanup(func() { _ = c.Close() })
	const lease = time.Second
	events := make(chan middleware.Event, 4)
	entered, proceed := make(chan struct{}), make(chan struct{})
	m, err := middleware.New(redis.New(c), middleware.GlobalScope, middleware.WithLease(lease),
		middleware.WithStoreFailure(middleware.StoreFailureRule{Timeouts: middleware.StoreTimeouts{Complete: 200 * time.Millisecond}}),
		middleware.WithObserver(middleware.ObserverFunc(func(_ context.Context, ev middleware.Event) { events <- ev })))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			entered <- struct{}{}
			<-proceed
		}
		io.WriteString(w, "charged")
	})))
	defer hs.Close()
	post := func(block bool) (int, string) {
		r, _ := http.NewRequest("POST", hs.URL+"/x", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", "k")
		if block {
			r.Header.Set("X-Block", "1")
		}
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	type answer struct {
		code int
		body string
	}
	first := make(chan answer, 1)
	go func() { code, body := post(true); first <- answer{code, body} }()
	<-entered
	pid := srv.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	t0 := time.Now()
	close(proceed)
	a := <-first
	waited := time.Since(t0)
	ev := <-events
	if a.code != 200 || a.body != "charged" || ev.Err == nil || ev.CompleteRetries == 0 {
		t.Fatalf("client got %d %q; event %+v; want the answer, the completion given up after retries", a.code, a.body, ev)
	}
	if waited > 3*lease {
		t.Fatalf("the client waited %v for a lease of %v", waited, lease)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	t.Logf("Redis SIGSTOPped while the handler ran: the client had its answer after %v (lease %v, %d completion retries)", waited, lease, ev.CompleteRetries)
	if code, body := post(false); code != 200 && code != http.StatusConflict || code == 200 && body != "charged" {
		t.Fatalf("after SIGCONT: %d %q, want 409 (lease live) or a run after the lease", code, body)
	}
}
