package middleware

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// Row: store full (a bounded memory store refused a new key) -> 503
// store_unavailable with Retry-After, decision StoreFull, the handler never
// runs, also with policy.StoreFailureRule.FailOpen; the keys the store holds are still answered,
// and no outage is logged.
func TestStoreFullFailsClosed(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run("failOpen="+strconv.FormatBool(failOpen), func(t *testing.T) {
			st := memory.New(memory.WithMaxBytes(8 << 10))
			var calls atomic.Int32
			var events []Event
			var logs bytes.Buffer
			m, err := New(st, GlobalScope, WithStoreFailure(policy.StoreFailureRule{FailOpen: failOpen, RetryAfter: 3 * time.Second}),
				WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))),
				WithObserver(ObserverFunc(func(_ context.Context, e Event) { events = append(events, e) })))
			if err != nil {
				t.Fatal(err)
			}
			h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				echoHandler(w, r)
			}))
			do := func(key string) *httptest.ResponseRecorder {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req("POST", "/orders", key, "body of "+key))
				return w
			}
			// A client sending distinct keys fills the store.
			n := 0
			for ; n < 1000; n++ {
				if w := do("flood-" + strconv.Itoa(n)); w.Code != http.StatusCreated {
					break
				}
			}
			if n == 0 || n == 1000 {
				t.Fatalf("%d new keys executed before the store filled", n)
			}
			before := calls.Load()
			w := do("one-more")
			checkProblem(t, w, http.StatusServiceUnavailable, CodeStoreUnavailable)
			if w.Header().Get("Retry-After") != "3" || calls.Load() != before {
				t.Fatalf("full store: Retry-After %q, %d handler runs", w.Header().Get("Retry-After"), calls.Load()-before)
			}
			if ev := events[len(events)-1]; ev.Decision != StoreFull || !errors.Is(ev.Err, store.ErrFull) || ev.Status != http.StatusServiceUnavailable {
				t.Fatalf("event %+v, want StoreFull with store.ErrFull", ev)
			}
			if w := do("flood-0"); w.Code != http.StatusCreated || w.Header().Get(DefaultReplayedHeader) != "true" || calls.Load() != before {
				t.Fatalf("replay from a full store: %d %q", w.Code, w.Header().Get(DefaultReplayedHeader))
			}
			if logs.Len() != 0 {
				t.Fatalf("a full store was logged as an outage:\n%s", logs.String())
			}
		})
	}
}
