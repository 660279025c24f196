package storetest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// WaitSubject is a fresh store for RunWaiting.
type WaitSubject struct {
	// Store must implement store.Waiter; empty, cleaned up by the opener.
	Store store.Store
	// Waiting, when set, reports the waits the store still tracks (registrations,
	// subscriptions); the suite requires 0 once every request returned.
	Waiting func() int
}

// RunWaiting runs the middleware's waiting duplicates (middleware.WithWaitInFlight)
// over the stores open returns, one per subtest: the duplicate of a request in
// flight gets the original's replay when it completes, runs once when it
// releases, gets 409 past the bound, stops at once when its client goes away, and
// many duplicates make one claim per wake-up. It reports the time from the
// original's completion to the duplicate's replay with t.Log.
func RunWaiting(t *testing.T, open func(t *testing.T) WaitSubject) {
	t.Helper()
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, e *waitEnv)
	}{
		{"OriginalCompletesWaiterReplays", testWaitReplay},
		{"OriginalReleasesWaiterRunsOnce", testWaitRelease},
		{"OriginalOutlivesBound409", testWaitBound},
		{"ClientGoneNoLeak", testWaitClientGone},
		{"ManyWaitersOneClaimPerWakeUp", testWaitMany},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			if _, ok := s.Store.(store.Waiter); !ok {
				t.Fatal("storetest: the store does not implement store.Waiter")
			}
			e := &waitEnv{subject: s, gate: make(chan struct{}), entered: make(chan struct{}, 1), waiting: make(chan struct{}, 64)}
			e.st = &countingWaiter{Store: s.Store, w: s.Store.(store.Waiter), entered: e.waiting}
			tc.run(t, e)
			if s.Waiting != nil {
				if n := s.Waiting(); n != 0 {
					t.Errorf("the store still tracks %d waits after every request returned", n)
				}
			}
		})
	}
}

// countingWaiter counts claims and waits, and signals each Wait's start.
type countingWaiter struct {
	store.Store
	w             store.Waiter
	claims, waits atomic.Int32
	entered       chan struct{}
}

func (c *countingWaiter) Claim(ctx context.Context, r store.ClaimRequest) (store.ClaimResult, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, r)
}

func (c *countingWaiter) Wait(ctx context.Context, id store.ID) error {
	c.waits.Add(1)
	select {
	case c.entered <- struct{}{}:
	default: // nobody counts this one (a second wait of the benchmark)
	}
	return c.w.Wait(ctx, id)
}

type waitEnv struct {
	subject WaitSubject
	st      *countingWaiter
	h       http.Handler
	gate    chan struct{} // closed: the original's handler answers
	entered chan struct{} // the original's handler started
	waiting chan struct{} // a duplicate entered Wait
	calls   atomic.Int32
	done    atomic.Int64 // when the original's handler returned (UnixNano)
}

// handler answers the first call with first once gate is closed, later calls
// at once with 200.
func (e *waitEnv) build(t *testing.T, first int, bound time.Duration) {
	m, err := middleware.New(e.st, middleware.GlobalScope, middleware.WithWaitInFlight(bound),
		middleware.WithLease(5*time.Second), middleware.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	e.h = m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := e.calls.Add(1)
		status := http.StatusOK
		if n == 1 {
			e.entered <- struct{}{}
			<-e.gate
			status = first
			defer func() { e.done.Store(time.Now().UnixNano()) }()
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, "answer %d", n)
	}))
}

func (e *waitEnv) send(ctx context.Context, key string) <-chan *httptest.ResponseRecorder {
	out := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/pay", strings.NewReader(`{"amountCents":1}`)).WithContext(ctx)
		r.Header.Set("Idempotency-Key", key)
		e.h.ServeHTTP(w, r)
		out <- w
	}()
	return out
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func recv(t *testing.T, ch <-chan *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	t.Helper()
	select {
	case w := <-ch:
		return w
	case <-time.After(2 * waitTimeout):
		t.Fatal("a request did not return")
		return nil
	}
}

func newKey() string { return "wait-" + store.NewToken().String() }

func testWaitReplay(t *testing.T, e *waitEnv) {
	e.build(t, http.StatusCreated, 10*time.Second)
	key := newKey()
	orig := e.send(t.Context(), key)
	waitFor(t, e.entered, "the original's handler")
	dup := e.send(t.Context(), key)
	waitFor(t, e.waiting, "the duplicate's wait")
	close(e.gate)
	wo, wd := recv(t, orig), recv(t, dup)
	if wo.Code != 201 || wd.Code != 201 || wd.Body.String() != "answer 1" || wd.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("original %d %q, duplicate %d %q replayed=%q; want the duplicate to replay the original",
			wo.Code, wo.Body, wd.Code, wd.Body, wd.Header().Get("Idempotent-Replayed"))
	}
	if n := e.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
	// One wait, one claim after it.
	if c, w := e.st.claims.Load(), e.st.waits.Load(); c != 3 || w != 1 {
		t.Errorf("store calls: %d claims, %d waits; want 3 and 1", c, w)
	}
	t.Logf("store calls of the waiting duplicate: %d claims + %d wait", e.st.claims.Load()-1, e.st.waits.Load())
}

func testWaitRelease(t *testing.T, e *waitEnv) {
	e.build(t, http.StatusServiceUnavailable, 10*time.Second)
	key := newKey()
	orig := e.send(t.Context(), key)
	waitFor(t, e.entered, "the original's handler")
	dup := e.send(t.Context(), key)
	waitFor(t, e.waiting, "the duplicate's wait")
	close(e.gate)
	wo, wd := recv(t, orig), recv(t, dup)
	if wo.Code != 503 || wd.Code != 200 || wd.Body.String() != "answer 2" || wd.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("original %d, duplicate %d %q; want the duplicate to run after the release", wo.Code, wd.Code, wd.Body)
	}
	if n := e.calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (the original, then the duplicate once)", n)
	}
}

func testWaitBound(t *testing.T, e *waitEnv) {
	const bound = 300 * time.Millisecond
	e.build(t, http.StatusCreated, bound)
	key := newKey()
	orig := e.send(t.Context(), key)
	waitFor(t, e.entered, "the original's handler")
	t0 := time.Now()
	wd := recv(t, e.send(t.Context(), key))
	elapsed := time.Since(t0)
	close(e.gate)
	recv(t, orig)
	if wd.Code != 409 || wd.Header().Get("Retry-After") == "" || !strings.Contains(wd.Body.String(), `"request_in_flight"`) {
		t.Fatalf("duplicate past the bound: %d %q", wd.Code, wd.Body)
	}
	if elapsed < bound || elapsed > bound+waitTimeout/2 {
		t.Errorf("409 after %v, want just past the bound %v", elapsed, bound)
	}
}

func testWaitClientGone(t *testing.T, e *waitEnv) {
	e.build(t, http.StatusCreated, time.Minute)
	key := newKey()
	orig := e.send(t.Context(), key)
	waitFor(t, e.entered, "the original's handler")
	ctx, cancel := context.WithCancel(t.Context())
	dup := e.send(ctx, key)
	waitFor(t, e.waiting, "the duplicate's wait")
	t0 := time.Now()
	cancel()
	wd := recv(t, dup)
	if d := time.Since(t0); d > waitTimeout/2 {
		t.Errorf("the duplicate returned %v after its client left", d)
	}
	if wd.Code != 409 {
		t.Errorf("duplicate whose client left: %d", wd.Code)
	}
	if c := e.st.claims.Load(); c != 2 {
		t.Errorf("%d claims; want 2 (none after the client left)", c)
	}
	close(e.gate)
	recv(t, orig)
}

func testWaitMany(t *testing.T, e *waitEnv) {
	const n = 20
	e.build(t, http.StatusCreated, 10*time.Second)
	key := newKey()
	orig := e.send(t.Context(), key)
	waitFor(t, e.entered, "the original's handler")
	dups := make([]<-chan *httptest.ResponseRecorder, n)
	for i := range dups {
		dups[i] = e.send(t.Context(), key)
	}
	for range n {
		waitFor(t, e.waiting, "the duplicates' waits")
	}
	close(e.gate)
	recv(t, orig)
	var slowest time.Duration
	for _, d := range dups {
		w := recv(t, d)
		if w.Code != 201 || w.Body.String() != "answer 1" {
			t.Fatalf("a duplicate got %d %q", w.Code, w.Body)
		}
		slowest = max(slowest, time.Since(time.Unix(0, e.done.Load())))
	}
	if c := e.calls.Load(); c != 1 {
		t.Errorf("handler ran %d times", c)
	}
	c, w := e.st.claims.Load(), e.st.waits.Load()
	if c != 1+n+w {
		t.Errorf("%d claims for %d waits of %d waiters: not one claim per wake-up", c, w, n)
	}
	if w > 2*n {
		t.Errorf("%d waits for %d waiters", w, n)
	}
	t.Logf("%d waiters: %d claims, %d waits; all replayed within %v of the completion", n, c-1, w, slowest)
}

// BenchWaiting measures a waiting duplicate over s (middleware.WithWaitInFlight):
// per iteration an original request claims a fresh key and holds it, a duplicate
// waits for it, and the original completes. It reports the duplicate's store
// calls (claims/op, waits/op: an immediate 409 costs 1 claim and 0 waits) and
// the time from the original's completion to the duplicate's replay
// (ns-to-replay/op).
func BenchWaiting(b *testing.B, s store.Store) {
	if _, ok := s.(store.Waiter); !ok {
		b.Fatal("storetest: the store does not implement store.Waiter")
	}
	e := &waitEnv{waiting: make(chan struct{}, 1)}
	e.st = &countingWaiter{Store: s, w: s.(store.Waiter), entered: e.waiting}
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	var completed atomic.Int64
	m, err := middleware.New(e.st, middleware.GlobalScope, middleware.WithWaitInFlight(10*time.Second),
		middleware.WithLease(10*time.Second), middleware.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	// The original's handler waits for gate; the middleware stores its answer
	// right after it returns.
	e.h = m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Original") != "" {
			entered <- struct{}{}
			<-gate
		}
		w.WriteHeader(http.StatusCreated)
		completed.Store(time.Now().UnixNano())
	}))
	do := func(key string, original bool) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/pay", strings.NewReader(`{"amountCents":1}`))
		r.Header.Set("Idempotency-Key", key)
		if original {
			r.Header.Set("X-Original", "1")
		}
		e.h.ServeHTTP(w, r)
		return w
	}
	var toReplay time.Duration
	var claims, waits int32
	b.ResetTimer()
	for b.Loop() {
		key := newKey()
		origDone := make(chan struct{})
		go func() { do(key, true); close(origDone) }()
		<-entered
		dupDone := make(chan *httptest.ResponseRecorder, 1)
		c0, w0 := e.st.claims.Load(), e.st.waits.Load()
		go func() { dupDone <- do(key, false) }()
		<-e.waiting
		gate <- struct{}{}
		w := <-dupDone
		replayed := time.Now()
		<-origDone
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
			b.Fatalf("duplicate: %d replayed=%q", w.Code, w.Header().Get("Idempotent-Replayed"))
		}
		toReplay += replayed.Sub(time.Unix(0, completed.Load()))
		claims += e.st.claims.Load() - c0
		waits += e.st.waits.Load() - w0
	}
	n := float64(b.N)
	b.ReportMetric(float64(claims)/n, "claims/op")
	b.ReportMetric(float64(waits)/n, "waits/op")
	b.ReportMetric(float64(toReplay.Nanoseconds())/n, "ns-to-replay/op")
}
