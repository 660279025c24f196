package postgres

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/middleware"
)

// TestHungPostgresLostClaimReleased: a request answered 503 while the private
// cluster is SIGSTOPped leaves a claim statement that lands when it resumes. The
// middleware generated the claim's token before the send and releases that claim
// in the background once Postgres answers again, so the client's retry runs
// within a second of the resume instead of getting 409 until the lease (10 s)
// ends.
func TestHungPostgresLostClaimReleased(t *testing.T) {
	c := startCluster(t)
	pool := newPool(t, c.url(), func(cfg *pgxpool.Config) { cfg.MaxConns = 4 })
	s, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	m, err := middleware.New(s, middleware.GlobalScope, middleware.WithLease(10*time.Second),
		middleware.WithStoreTimeouts(middleware.StoreTimeouts{Claim: 500 * time.Millisecond, Release: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.WriteString(w, "charged")
	})))
	defer srv.Close()
	post := func(key string) int {
		r, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", key)
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("warm"); code != 200 { // connections open and idle
		t.Fatalf("warm-up: %d", code)
	}
	c.signal(t, syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			c.signal(t, syscall.SIGCONT)
		}
	}()
	if code := post("lost"); code != http.StatusServiceUnavailable {
		t.Fatalf("claim against a hung Postgres: %d, want 503", code)
	}
	time.Sleep(2 * time.Second) // the outage lasts: background releases time out meanwhile
	c.signal(t, syscall.SIGCONT)
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
