package redis_test

import (
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

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/storetest"
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
	m, err := middleware.New(redis.NewForTest(t, c), middleware.GlobalScope, middleware.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: bound}}))
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

// TestRedisHungWhileHandlerRuns stops a private Redis with SIGSTOP while a
// request is in its handler: the client has the handler's whole answer within
// one store bound, and the completion, retried in the background, stores the
// record after SIGCONT, which the retry replays (storetest.HungWhileHandlerRuns).
func TestRedisHungWhileHandlerRuns(t *testing.T) {
	srv := redistest.StartServer(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 4})
	t.Cleanup(func() { _ = c.Close() })
	pid := srv.Pid()
	storetest.HungWhileHandlerRuns(t, redis.NewForTest(t, c),
		func() {
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
		},
		func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		})
}
