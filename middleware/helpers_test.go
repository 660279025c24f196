package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// fakeClock schedules renewals that tests fire by hand, and is the clock that
// measures handler durations (Now, moved by advance).
type fakeClock struct {
	mu     sync.Mutex
	timers []*fakeTimer
	now    time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type fakeTimer struct {
	c     *fakeClock
	d     time.Duration
	f     func()
	armed bool
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) claim.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, d: d, f: f, armed: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed, t.d = true, d
	return was
}

// fire runs every armed timer's function on the caller's goroutine and returns
// how many ran.
func (c *fakeClock) fire() int {
	c.mu.Lock()
	var due []*fakeTimer
	for _, t := range c.timers {
		if t.armed {
			t.armed = false
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
	return len(due)
}

func (c *fakeClock) armed() (n int, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.timers {
		if t.armed {
			n++
			d = t.d
		}
	}
	return n, d
}

// hookStore wraps a store to inject failures and count calls.
type hookStore struct {
	store.Store
	claimErr    error
	completeErr error
	// completeFails is how many Complete calls fail before they pass through.
	completeFails atomic.Int32
	renewErr      atomic.Value // error returned by Renew, if set
	renews        atomic.Int32
	releases      atomic.Int32
	completes     atomic.Int32
}

func (h *hookStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if h.claimErr != nil {
		return store.ClaimResult{}, h.claimErr
	}
	return h.Store.Claim(ctx, req)
}

func (h *hookStore) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	h.completes.Add(1)
	if h.completeErr != nil {
		return h.completeErr
	}
	if h.completeFails.Add(-1) >= 0 {
		return errors.New("write timeout (injected)")
	}
	return h.Store.Complete(ctx, id, tok, resp, ret)
}

func (h *hookStore) Release(ctx context.Context, id store.ID, tok store.Token) error {
	h.releases.Add(1)
	return h.Store.Release(ctx, id, tok)
}

func (h *hookStore) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	h.renews.Add(1)
	if err, _ := h.renewErr.Load().(error); err != nil {
		return err
	}
	return h.Store.Renew(ctx, id, tok, lease)
}

// env is one middleware over a memory store with fake clocks and a counting handler.
type env struct {
	t     *testing.T
	mem   *memory.Store
	st    *hookStore
	now   *testclock.Clock // the memory store's clock, moved by tests
	clk   *fakeClock
	calls atomic.Int32
	mu    sync.Mutex
	// observed is signalled (with mu) after each observer event.
	observed *sync.Cond
	events   []Event
	h        http.Handler
}

func newEnv(t *testing.T, handler http.HandlerFunc, opts ...Option) *env {
	t.Helper()
	var e *env
	e = newEnvHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.calls.Add(1)
		handler(w, r)
	}), opts...)
	return e
}

// newEnvHandler is newEnv with next handed to the middleware as it is (a
// *http.ServeMux stays one); calls is not counted.
func newEnvHandler(t *testing.T, next http.Handler, opts ...Option) *env {
	t.Helper()
	e := &env{t: t, now: testclock.New(time.Unix(1_700_000_000, 0)), clk: &fakeClock{}}
	e.observed = sync.NewCond(&e.mu)
	e.mem = memory.New(memory.WithClock(e.now.Now))
	e.st = &hookStore{Store: e.mem}
	obs := ObserverFunc(func(_ context.Context, ev Event) {
		e.mu.Lock()
		e.events = append(e.events, ev)
		e.mu.Unlock()
		e.observed.Broadcast()
	})
	all := append([]Option{WithClock(e.clk), WithObserver(obs), WithLogger(discardLogger())}, opts...)
	m, err := New(e.st, ScopeFromHeader("X-Client-ID", "anonymous"), all...)
	if err != nil {
		t.Fatal(err)
	}
	e.h = m.Handler(next)
	return e
}

// req builds a request; headers are name/value pairs.
func req(method, target, key, body string, headers ...string) *http.Request {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func (e *env) do(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return w
}

func (e *env) lastEvent() Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.events) == 0 {
		e.t.Fatal("no observer event")
	}
	return e.events[len(e.events)-1]
}

// waitEvents blocks until the observer has seen at least n events: the
// middleware reports a request after its store calls, which may come after the
// client has its answer.
func (e *env) waitEvents(n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for len(e.events) < n {
		e.observed.Wait()
	}
}

func (e *env) eventCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.events)
}

// echoHandler answers 201 with the request body and a few headers.
func echoHandler(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	w.Write(b)
}

type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

func checkProblem(t *testing.T, w *httptest.ResponseRecorder, status int, code string) problemBody {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q", ct)
	}
	var p problemBody
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if p.Code != code || p.Status != status || p.Type != ProblemTypePrefix+code || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem = %+v, want code %s status %d", p, code, status)
	}
	return p
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
