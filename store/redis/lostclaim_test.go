package redis_test

import (
	"io"
	"net/http"
	"net/http/httptest"
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

// TestHungRedisLostClaimReleased: a request answered 503 while a private Redis
// is SIGSTOPped leaves a claim script that runs when it resumes. The middleware
// generated the claim's token before the send and releases that claim in the
// background once Redis answers again, so the client's retry runs within a second
// of the resume instead of getting 409 until the lease (10 s) ends.
func TestHungRedisLostClaimReleased(t *testing.T) {
	srv := redistest.StartServer(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 4})
	t.Cleanup(func() { _ = c.Close() })
	var runs atomic.Int32
	m, err := middleware.New(redis.New(c), middleware.GlobalScope, middleware.WithLease(10*time.Second),
		middleware.WithStoreTimeouts(middleware.StoreTimeouts{Claim: 500 * time.Millisecond, Release: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.WriteString(w, "charged")
	})))
	defer hs.Close()
	post := func(key string) int {
		r, _ := http.NewRequest("POST", hs.URL+"/x", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", key)
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("warm"); code != 200 {
		t.Fatalf("warm-up: %d", code)
	}
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
	if code := post("lost"); code != http.StatusServiceUnavailable {
		t.Fatalf("claim against a hung Redis: %d, want 503", code)
	}
	time.Sleep(2 * time.Second) // the outage lasts: background releases time out meanwhile
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	resumed := time.Now()
	codes := map[int]int{}
	for {
		code := post("lost")
		codes[code]++
		if code == 200 {
			break
		}
		if time.Since(resumed) > 15*time.Second {
			t.Fatalf("retries after SIGCONT never ran: %v", codes)
		}
		time.Sleep(20 * time.Millisecond) // a client's retry pace
	}
	took := time.Since(resumed)
	t.Logf("retry ran %v after SIGCONT (answers before: %v)", took, codes)
	if took > time.Second || runs.Load() != 2 {
		t.Fatalf("retry ran %v after SIGCONT (answers %v, %d runs), want within a second, once", took, codes, runs.Load())
	}
}
