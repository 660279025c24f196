package accountsapp

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// TestTakeoverFromRequest: the account API learns of a takeover from the middleware's
// claim. The first request's handler is still running (as if its replica hung) when
// its lease expires on the store's clock; the retry with the same key takes the key
// over and its handler sees takeoverFromRequest true. A fresh key's handler sees false.
func TestTakeoverFromRequest(t *testing.T) {
	clock := testclock.New(time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC))
	mw, err := middleware.New(memory.New(memory.WithClock(clock.Now)), middleware.ScopeFromPrincipal(AnonymousScope),
		middleware.WithLease(time.Hour)) // renewals, every third of the lease on the real clock, never come
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	seen := make(chan bool, 3)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- takeoverFromRequest(r)
		if r.Header.Get("X-Hang") == "1" {
			close(entered)
			<-release
		}
	}))
	send := func(key string, hang bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/api/accounts/x/deposit", strings.NewReader(`{"amountCents":1}`))
		req.Header.Set("Idempotency-Key", key)
		if hang {
			req.Header.Set("X-Hang", "1")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	done := make(chan struct{})
	go func() { defer close(done); send("K", true) }()
	<-entered
	if <-seen {
		t.Fatal("the first claim is not a takeover")
	}
	clock.Add(2 * time.Hour) // the first holder's lease expires
	if w := send("K", false); w.Code != 200 || !<-seen {
		t.Fatalf("retry after the lease expired: status %d, takeover not seen", w.Code)
	}
	if w := send("other", false); w.Code != 200 || <-seen {
		t.Fatalf("fresh key: status %d, takeover seen", w.Code)
	}
	close(release)
	<-done
}
