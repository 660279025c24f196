package storetest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// LostClaimReleased checks, through the middleware, that a claim whose answer
// was lost does not block its key: with the store's server hung by pause (a
// SIGSTOP), a request is answered 503 after the claim bound (500 ms) while its
// claim is still on its way; after resume (SIGCONT) the claim lands, and the
// middleware releases it in the background, fenced by the token it generated
// before the send, so the client's retry runs within a second instead of getting
// 409 until the lease (10 s) ends. The server must answer before pause.
func LostClaimReleased(t *testing.T, st store.Store, pause, resume func()) {
	t.Helper()
	var runs atomic.Int32
	m, err := middleware.New(st, middleware.GlobalScope, middleware.WithLease(10*time.Second),
		middleware.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: 500 * time.Millisecond, Release: time.Second}}))
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
	pause()
	paused := true
	defer func() {
		if paused {
			resume()
		}
	}()
	if code := post("lost"); code != http.StatusServiceUnavailable {
		t.Fatalf("claim against a hung store: %d, want 503", code)
	}
	time.Sleep(2 * time.Second) // the outage lasts: background releases time out meanwhile
	resume()
	paused = false
	resumed := time.Now()
	codes := map[int]int{}
	for {
		code := post("lost")
		codes[code]++
		if code == 200 {
			break
		}
		if time.Since(resumed) > 15*time.Second {
			t.Fatalf("retries after the resume never ran: %v", codes)
		}
		time.Sleep(20 * time.Millisecond) // a client's retry pace
	}
	took := time.Since(resumed)
	t.Logf("retry ran %v after the resume (answers before: %v)", took, codes)
	if took > time.Second || runs.Load() != 2 {
		t.Fatalf("retry ran %v after the resume (answers %v, %d runs), want within a second, once", took, codes, runs.Load())
	}
}
