package middleware

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

type traceKey struct{}

// tracingObserver records the store calls around which it is called and the
// events, in order, and puts "span:<op>" in each call's context.
type tracingObserver struct {
	mu    sync.Mutex
	trail []string
	last  Event
}

func (o *tracingObserver) add(s string) {
	o.mu.Lock()
	o.trail = append(o.trail, s)
	o.mu.Unlock()
}

func (o *tracingObserver) Observe(_ context.Context, e Event) {
	o.add("event " + e.Decision.String())
	o.mu.Lock()
	o.last = e
	o.mu.Unlock()
}

func (o *tracingObserver) StoreCallStart(ctx context.Context, op StoreOp, id store.ID) (context.Context, func(error)) {
	o.add("start " + op.String() + " " + id.Key)
	return context.WithValue(ctx, traceKey{}, "span:"+op.String()), func(err error) { o.add(fmt.Sprintf("done %s %v", op, err)) }
}

// ctxStore records the span its calls' contexts carry.
type ctxStore struct {
	store.Store
	o       *tracingObserver
	failAll bool
}

func (s *ctxStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	s.o.add(fmt.Sprint("store claim in ", ctx.Value(traceKey{})))
	if s.failAll {
		return store.ClaimResult{}, errors.New("down")
	}
	return s.Store.Claim(ctx, req)
}

func (s *ctxStore) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	s.o.add(fmt.Sprint("store complete in ", ctx.Value(traceKey{})))
	return s.Store.Complete(ctx, id, tok, resp, ret)
}

func (s *ctxStore) Release(ctx context.Context, id store.ID, tok store.Token) error {
	if ctx.Value(traceKey{}) == nil {
		// The background release of a claim whose answer was lost (package claim):
		// off the request's path, not observed, not part of the trail.
		return s.Store.Release(ctx, id, tok)
	}
	s.o.add(fmt.Sprint("store release in ", ctx.Value(traceKey{})))
	return s.Store.Release(ctx, id, tok)
}

// TestStoreObserver: an observer implementing StoreObserver is called around
// each store call on the request's path, the store gets the context it
// returned, and a replay's event carries the original's completion time.
func TestStoreObserver(t *testing.T) {
	clock := testclock.New(time.Unix(1_700_000_000, 0).UTC())
	o := &tracingObserver{}
	st := &ctxStore{Store: memory.New(memory.WithClock(clock.Now)), o: o}
	m, err := New(st, GlobalScope, WithObserver(o), WithLogger(discardLogger()), WithClock(&fakeClock{}))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/fail":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/panic":
			panic("bug")
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	serve := func(path, key string) {
		defer func() { recover() }()
		h.ServeHTTP(httptest.NewRecorder(), req("POST", path, key, "x"))
	}
	for _, tc := range []struct {
		path, key string
		down      bool
		want      string
	}{
		{"/ok", "a", false, "start claim a, store claim in span:claim, done claim <nil>, start complete a, store complete in span:complete, done complete <nil>, event executed"},
		{"/ok", "a", false, "start claim a, store claim in span:claim, done claim <nil>, event replayed"},
		{"/fail", "b", false, "start claim b, store claim in span:claim, done claim <nil>, start release b, store release in span:release, done release <nil>, event released"},
		{"/panic", "c", false, "start claim c, store claim in span:claim, done claim <nil>, start release c, store release in span:release, done release <nil>, event released"},
		{"/ok", "d", true, "start claim d, store claim in span:claim, done claim down, event store_error"},
	} {
		o.trail = nil
		st.failAll = tc.down
		serve(tc.path, tc.key)
		if got := strings.Join(o.trail, ", "); got != tc.want {
			t.Errorf("%s %s:\n got %s\nwant %s", tc.path, tc.key, got, tc.want)
		}
		if tc.want[len(tc.want)-8:] == "replayed" && !o.last.CompletedAt.Equal(clock.Now()) {
			t.Errorf("replay's CompletedAt %v, want the original's completion %v", o.last.CompletedAt, clock.Now())
		}
	}
}

// TestWaitEndIsNoStoreError: a duplicate's wait that ends on its own bound, or
// because its client left, is reported to the StoreObserver as a call that did
// not fail (no error span, no error=true latency sample); the answer is the 409.
func TestWaitEndIsNoStoreError(t *testing.T) {
	for _, how := range []string{"bound", "client gone"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := &tracingObserver{}
				gate := make(chan struct{})
				m, err := New(memory.New(), GlobalScope, WithObserver(o), WithLogger(discardLogger()), WithWaitInFlight(time.Second))
				if err != nil {
					t.Fatal(err)
				}
				h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get("X-First") != "" {
						<-gate
					}
					w.WriteHeader(http.StatusCreated)
				}))
				orig := make(chan struct{})
				go func() {
					defer close(orig)
					h.ServeHTTP(httptest.NewRecorder(), req("POST", "/x", "k", "b", "X-First", "1"))
				}()
				synctest.Wait() // the original holds the key
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				dup := make(chan int)
				go func() {
					w := httptest.NewRecorder()
					h.ServeHTTP(w, req("POST", "/x", "k", "b").WithContext(ctx))
					dup <- w.Code
				}()
				synctest.Wait() // the duplicate waits
				if how == "client gone" {
					cancel()
				}
				if code := <-dup; code != http.StatusConflict {
					t.Errorf("duplicate answered %d, want 409", code)
				}
				close(gate)
				<-orig
				o.mu.Lock()
				defer o.mu.Unlock()
				var waits []string
				for _, s := range o.trail {
					if strings.HasPrefix(s, "done wait") {
						waits = append(waits, s)
					}
				}
				if len(waits) == 0 || slices.ContainsFunc(waits, func(s string) bool { return s != "done wait <nil>" }) {
					t.Errorf("wait calls ended %q, want each without error", waits)
				}
			})
		})
	}
}
