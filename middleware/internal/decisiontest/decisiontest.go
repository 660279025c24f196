// Package decisiontest is the decision table of docs/architecture.md section 3 as
// one test table, run against the net/http middleware and against every router
// adapter (echo v4, echo v5, gin) and router (chi) the project supports, so they
// are held to the same behaviour.
//
// The package only depends on the core: each adapter's test builds its router
// in a Factory, with the routes described at Factory, and calls Run.
package decisiontest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// Limits the middleware of every table row is built with.
const (
	// MaxRequestBody is the fingerprint limit in bytes.
	MaxRequestBody = 64
	// MaxStoredBody is the storage cap in bytes; App.Large answers more.
	MaxStoredBody = 128
)

// Factory builds the router under test, with m in front of these routes (the
// paths in the router's own syntax; every handler calls the App method named):
//
//	POST /api/pay/{id}   App.Pay(id param, key and ok from the adapter's KeyFromContext,
//	                     request body); answer 201 with the returned value as JSON
//	                     and the header X-Run set to the returned run number
//	POST /api/slow       answer 200 text App.Slow()
//	POST /api/flaky      if App.Flaky(): the router's error path with 503 and the
//	                     message "try later" (a returned error where the router has
//	                     one); else 200 text "fine"
//	POST /api/panic      App.Panic(), then 200 text "fine"; a recover outside m
//	                     answers a panic 500
//	POST /api/large      answer 200 text App.Large()
//	POST /api/refuse     App.Refuse(), then the router's error path with 422 and
//	                     the message "no"
//	GET  /api/pay/{id}   answer 200 text App.Get(ok), ok from KeyFromContext
type Factory func(t *testing.T, m *middleware.Middleware, a *App) http.Handler

// App is the application behind the router: handlers count their runs here,
// and rows steer them.
type App struct {
	st      *flakyStore
	clock   *testclock.Clock   // the store's clock
	runs    sync.Map           // route label -> *atomic.Int64
	entered chan chan struct{} // Slow sends the channel that releases it
	fail    atomic.Int64       // Flaky fails and Panic panics while > 0 (decremented per run)
}

// flakyStore fails every Claim while down is set.
type flakyStore struct {
	store.Store
	down    atomic.Bool
	waiting chan struct{} // a Wait started (buffered)
}

// Wait forwards to the memory store's notification (middleware.WithWaitInFlight)
// and tells waiting of each call.
func (f *flakyStore) Wait(ctx context.Context, id store.ID) error {
	select {
	case f.waiting <- struct{}{}:
	default:
	}
	return f.Store.(store.Waiter).Wait(ctx, id)
}

func (f *flakyStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if f.down.Load() {
		return store.ClaimResult{}, errors.New("connection refused")
	}
	return f.Store.Claim(ctx, req)
}

// Runs returns how often the handler of a route ran ("pay", "slow", "flaky",
// "panic", "large", "refuse", "get").
func (a *App) Runs(label string) int64 {
	v, _ := a.runs.LoadOrStore(label, new(atomic.Int64))
	return v.(*atomic.Int64).Load()
}

func (a *App) ran(label string) int64 {
	v, _ := a.runs.LoadOrStore(label, new(atomic.Int64))
	return v.(*atomic.Int64).Add(1)
}

// Pay records a run and returns its number (for the X-Run header) and the body
// to answer as JSON: the path parameter, the key and scope, and the request body.
func (a *App) Pay(param string, id store.ID, ok bool, body []byte) (run string, v map[string]any) {
	n := a.ran("pay")
	return fmt.Sprint(n), map[string]any{"id": param, "key": id.Key, "scope": id.Scope, "keyed": ok, "body": string(body)}
}

// guard bounds a wait that a broken adapter would make endless (a handler run
// the row does not expect, or one that never starts), so the row fails instead
// of hanging the test binary. Correct runs never come near it.
const guard = 30 * time.Second

// Slow records a run and blocks until the row releases it; it returns
// "slow run N" ("slow run N unexpected" when no row step was waiting for it).
func (a *App) Slow() string {
	n := a.ran("slow")
	release := make(chan struct{})
	select {
	case a.entered <- release:
	case <-time.After(guard):
		return fmt.Sprint("slow run ", n, " unexpected")
	}
	<-release
	return fmt.Sprint("slow run ", n)
}

// enter waits for a Slow run to start and returns its release.
func (hs *harness) enter(t *testing.T) chan struct{} {
	t.Helper()
	select {
	case release := <-hs.a.entered:
		return release
	case <-time.After(guard):
		t.Fatal("the slow handler did not start")
		return nil
	}
}

// Flaky records a run and reports whether this run must fail with 503.
func (a *App) Flaky() bool {
	a.ran("flaky")
	return a.fail.Add(-1) >= 0
}

// Panic records a run and panics while the row asks for it.
func (a *App) Panic() {
	a.ran("panic")
	if a.fail.Add(-1) >= 0 {
		panic("handler bug")
	}
}

// Large records a run and returns a body over MaxStoredBody (200 bytes).
func (a *App) Large() string {
	a.ran("large")
	return strings.Repeat("L", 200)
}

// Refuse records a run.
func (a *App) Refuse() { a.ran("refuse") }

// Get records a run and returns "keyed=<ok>".
func (a *App) Get(ok bool) string {
	a.ran("get")
	return fmt.Sprint("keyed=", ok)
}

// harness is one row's router and app, and the responses its requests got.
type harness struct {
	h http.Handler
	a *App

	mu   sync.Mutex
	seen []Observation
}

// Req is one request of a row.
type req struct {
	method, path, key, body, client string
	keys                            []string // several header lines
}

func (hs *harness) do(r req) *httptest.ResponseRecorder {
	hr := httptest.NewRequest(r.method, r.path, strings.NewReader(r.body))
	if r.key != "" {
		hr.Header.Set("Idempotency-Key", r.key)
	}
	for _, k := range r.keys {
		hr.Header.Add("Idempotency-Key", k)
	}
	if r.client != "" {
		hr.Header.Set("X-Client-ID", r.client)
	}
	w := httptest.NewRecorder()
	hs.h.ServeHTTP(w, hr)
	hs.mu.Lock()
	hs.seen = append(hs.seen, Observe(w.Result()))
	hs.mu.Unlock()
	return w
}

func problemCode(t *testing.T, w *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d: %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != middleware.ProblemContentType {
		t.Errorf("Content-Type %q, want problem+json", ct)
	}
	if !strings.Contains(w.Body.String(), `"code":"`+code+`"`) {
		t.Errorf("body %s lacks code %s", w.Body, code)
	}
}

func decode(t *testing.T, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("body %q: %v", w.Body, err)
	}
	return v
}

// Row is one row of the table; doc is the id of the row of docs/architecture.md
// section 3 whose answer its requests must observe.
type row struct {
	name string
	doc  string
	opts []middleware.Option
	run  func(t *testing.T, hs *harness)
}

var pay = req{method: "POST", path: "/api/pay/7", key: `"k-1"`, body: `{"n":1}`, client: "alice"}

var rows = []row{
	{name: "new key runs once, retry replayed with marker", doc: "new-key", run: func(t *testing.T, hs *harness) {
		first := hs.do(pay)
		if first.Code != 201 || first.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("first: %d %v %s", first.Code, first.Header(), first.Body)
		}
		got := fmt.Sprint(decode(t, first))
		if want := `map[body:{"n":1} id:7 key:k-1 keyed:true scope:alice]`; got != want {
			t.Errorf("body %s, want %s (key, scope, param and body reach the handler)", got, want)
		}
		again := hs.do(pay)
		if again.Code != 201 || again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != first.Body.String() ||
			again.Header().Get("X-Run") != "1" || again.Header().Get("Content-Type") != first.Header().Get("Content-Type") {
			t.Errorf("replay: %d %v %q", again.Code, again.Header(), again.Body)
		}
		if n := hs.a.Runs("pay"); n != 1 {
			t.Errorf("handler ran %d times, want 1", n)
		}
		other := pay
		other.client = "bob" // another scope: its own record
		if w := hs.do(other); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
			t.Errorf("other scope: %d %v", w.Code, w.Header())
		}
	}},
	{name: "same key while running is 409 with Retry-After", doc: "in-flight", run: func(t *testing.T, hs *harness) {
		slow := req{method: "POST", path: "/api/slow", key: "s", body: "x"}
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- hs.do(slow) }()
		release := hs.enter(t)
		w := hs.do(slow)
		close(release)
		first := <-done
		problemCode(t, w, 409, middleware.CodeInFlight)
		if w.Header().Get("Retry-After") == "" {
			t.Error("409 without Retry-After")
		}
		if first.Code != 200 || first.Body.String() != "slow run 1" {
			t.Errorf("original: %d %s", first.Code, first.Body)
		}
		if n := hs.a.Runs("slow"); n != 1 {
			t.Errorf("handler ran %d times", n)
		}
	}},
	{name: "same key while running, waiting on: the retry gets the original's answer", doc: "wait-in-flight", opts: []middleware.Option{middleware.WithWaitInFlight(guard)}, run: func(t *testing.T, hs *harness) {
		slow := req{method: "POST", path: "/api/slow", key: "w", body: "x"}
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() { done <- hs.do(slow) }()
		release := hs.enter(t)
		retry := make(chan *httptest.ResponseRecorder, 1)
		go func() { retry <- hs.do(slow) }()
		select {
		case <-hs.a.st.waiting: // the retry waits for the original
		case <-time.After(guard):
			t.Fatal("the retry did not wait")
		}
		close(release)
		first, w := <-done, <-retry
		if first.Code != 200 || first.Body.String() != "slow run 1" {
			t.Errorf("original: %d %s", first.Code, first.Body)
		}
		if w.Code != 200 || w.Body.String() != "slow run 1" || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry racing the original: %d %v %q, want its answer replayed", w.Code, w.Header(), w.Body)
		}
		if n := hs.a.Runs("slow"); n != 1 {
			t.Errorf("handler ran %d times", n)
		}
	}},
	{name: "same key, other body is 422", doc: "mismatch", run: func(t *testing.T, hs *harness) {
		hs.do(pay)
		other := pay
		other.body = `{"n":2}`
		problemCode(t, hs.do(other), 422, middleware.CodeMismatch)
		if w := hs.do(pay); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Error("the stored record changed after a mismatch")
		}
		if n := hs.a.Runs("pay"); n != 1 {
			t.Errorf("handler ran %d times", n)
		}
	}},
	{name: "missing key is 400", doc: "key-missing", run: func(t *testing.T, hs *harness) {
		problemCode(t, hs.do(req{method: "POST", path: "/api/pay/1", body: "{}"}), 400, middleware.CodeKeyMissing)
		if n := hs.a.Runs("pay"); n != 0 {
			t.Errorf("handler ran %d times", n)
		}
	}},
	{name: "invalid keys are 400", doc: "key-invalid", run: func(t *testing.T, hs *harness) {
		for _, r := range []req{
			{method: "POST", path: "/api/pay/1", key: `"unterminated`},
			{method: "POST", path: "/api/pay/1", key: strings.Repeat("k", 256)},
			{method: "POST", path: "/api/pay/1", keys: []string{"a", "b"}},
		} {
			problemCode(t, hs.do(r), 400, middleware.CodeKeyInvalid)
		}
		if n := hs.a.Runs("pay"); n != 0 {
			t.Errorf("handler ran %d times", n)
		}
	}},
	{name: "body over the limit is 413", doc: "body-too-large", run: func(t *testing.T, hs *harness) {
		problemCode(t, hs.do(req{method: "POST", path: "/api/pay/1", key: "big", body: strings.Repeat("x", MaxRequestBody+1)}), 413, middleware.CodeRequestTooLarge)
	}},
	{name: "handler error 5xx releases, the retry runs, then replays", doc: "release-status", run: func(t *testing.T, hs *harness) {
		hs.a.fail.Store(1)
		r := req{method: "POST", path: "/api/flaky", key: "f"}
		if w := hs.do(r); w.Code != 503 || !strings.Contains(w.Body.String(), "try later") {
			t.Fatalf("first: %d %q (the router's error path must render the error)", w.Code, w.Body)
		}
		if w := hs.do(r); w.Code != 200 || w.Body.String() != "fine" || w.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry: %d %v %s", w.Code, w.Header(), w.Body)
		}
		if w := hs.do(r); w.Code != 200 || w.Body.String() != "fine" || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("third: %d %v %q", w.Code, w.Header(), w.Body)
		}
		if n := hs.a.Runs("flaky"); n != 2 {
			t.Errorf("handler ran %d times, want 2", n)
		}
	}},
	{name: "handler error 4xx is rendered once, stored and replayed", doc: "replay", run: func(t *testing.T, hs *harness) {
		r := req{method: "POST", path: "/api/refuse", key: "r"}
		first := hs.do(r)
		if first.Code != 422 || !strings.Contains(first.Body.String(), "no") {
			t.Fatalf("first: %d %q", first.Code, first.Body)
		}
		again := hs.do(r)
		if again.Code != 422 || again.Body.String() != first.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay: %d %v %q, want %q", again.Code, again.Header(), again.Body, first.Body)
		}
		if n := hs.a.Runs("refuse"); n != 1 {
			t.Errorf("handler ran %d times", n)
		}
	}},
	{name: "store error is 503 with Retry-After; handler not run", doc: "store-down", run: func(t *testing.T, hs *harness) {
		hs.a.st.down.Store(true)
		w := hs.do(pay)
		problemCode(t, w, 503, middleware.CodeStoreUnavailable)
		if w.Header().Get("Retry-After") == "" {
			t.Error("503 without Retry-After")
		}
		if n := hs.a.Runs("pay"); n != 0 {
			t.Errorf("handler ran %d times", n)
		}
	}},
	{name: "panic releases and re-panics, the retry runs", doc: "release-status", run: func(t *testing.T, hs *harness) {
		hs.a.fail.Store(1)
		r := req{method: "POST", path: "/api/panic", key: "p"}
		if w := hs.do(r); w.Code != 500 {
			t.Fatalf("panic: %d %s (the recover outside the middleware answers 500)", w.Code, w.Body)
		}
		if w := hs.do(r); w.Code != 200 || w.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry: %d %v", w.Code, w.Header())
		}
		if n := hs.a.Runs("panic"); n != 2 {
			t.Errorf("handler ran %d times, want 2", n)
		}
	}},
	{name: "response over the storage cap streams, replay omits the body", doc: "over-cap", run: func(t *testing.T, hs *harness) {
		r := req{method: "POST", path: "/api/large", key: "l"}
		if w := hs.do(r); w.Code != 200 || w.Body.Len() != 200 {
			t.Fatalf("first: %d, %d bytes", w.Code, w.Body.Len())
		}
		w := hs.do(r)
		if w.Code != 200 || w.Body.Len() != 0 || w.Header().Get("Idempotency-Replay") != "omitted" || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay: %d %v %q", w.Code, w.Header(), w.Body)
		}
		if n := hs.a.Runs("large"); n != 1 {
			t.Errorf("handler ran %d times", n)
		}
	}},
	{name: "expired lease is taken over; the stale holder's completion is refused", doc: "takeover", run: func(t *testing.T, hs *harness) {
		slow := req{method: "POST", path: "/api/slow", key: "s", body: "x"}
		stale := make(chan *httptest.ResponseRecorder)
		go func() { stale <- hs.do(slow) }()
		release1 := hs.enter(t)
		hs.a.clock.Add(time.Hour) // the holder's lease is over on the store's clock
		second := make(chan *httptest.ResponseRecorder)
		go func() { second <- hs.do(slow) }()
		release2 := hs.enter(t) // the takeover runs the handler once more
		close(release2)
		w2 := <-second
		close(release1)
		w1 := <-stale
		if w1.Body.String() != "slow run 1" || w2.Body.String() != "slow run 2" || hs.a.Runs("slow") != 2 {
			t.Fatalf("holders answered %q and %q, runs %d", w1.Body, w2.Body, hs.a.Runs("slow"))
		}
		if w := hs.do(slow); w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "slow run 2" {
			t.Errorf("replay after the takeover: %d %v %q, want the new holder's answer", w.Code, w.Header(), w.Body)
		}
	}},
	{name: "GET passes through, key ignored", doc: "pass-through", run: func(t *testing.T, hs *harness) {
		for range 2 {
			w := hs.do(req{method: "GET", path: "/api/pay/1", key: "g"})
			if w.Code != 200 || w.Body.String() != "keyed=false" || w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("GET: %d %v %s", w.Code, w.Header(), w.Body)
			}
		}
		if n := hs.a.Runs("get"); n != 2 {
			t.Errorf("GET handler ran %d times, want 2", n)
		}
	}},
	{name: "optional key: a request without one runs unprotected", doc: "pass-through", opts: []middleware.Option{middleware.WithKey(policy.KeyRule{Optional: true})}, run: func(t *testing.T, hs *harness) {
		for range 2 {
			w := hs.do(req{method: "POST", path: "/api/pay/1", body: "{}"})
			if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" || !strings.Contains(w.Body.String(), `"keyed":false`) {
				t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body)
			}
		}
		if n := hs.a.Runs("pay"); n != 2 {
			t.Errorf("handler ran %d times, want 2", n)
		}
	}},
}

// New returns a fresh App and the middleware every row uses (scope from
// X-Client-ID, the limits above, a discarding logger, then opts), over a memory
// store on a manual clock. Adapters' own tests use it for their extra cases.
func New(t *testing.T, opts ...middleware.Option) (*middleware.Middleware, *App) {
	t.Helper()
	a := &App{clock: testclock.New(time.Unix(1_700_000_000, 0)), entered: make(chan chan struct{})}
	a.st = &flakyStore{Store: memory.New(memory.WithClock(a.clock.Now)), waiting: make(chan struct{}, 1)}
	m, err := middleware.New(a.st, middleware.ScopeFromHeader("X-Client-ID", "anonymous"), append([]middleware.Option{
		middleware.WithRequestFingerprint(middleware.FingerprintRule{MaxBody: MaxRequestBody}), middleware.WithReplay(middleware.ReplayRule{MaxBody: MaxStoredBody}),
		middleware.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m, a
}

// Run runs every row of the table as a subtest, each on a router newServer
// builds with a fresh middleware (New, plus opts and the row's options) and App,
// and checks that the responses of each row's requests include the answer the
// row of docs/architecture.md section 3 it covers gives (Doc, Matches). It
// returns the responses by that row's id, for TestDecisionTableDoc.
func Run(t *testing.T, newServer Factory, opts ...middleware.Option) map[string][]Observation {
	doc := Doc(t)
	seen := make(map[string][]Observation)
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			m, a := New(t, append(append([]middleware.Option{}, opts...), r.opts...)...)
			hs := &harness{h: newServer(t, m, a), a: a}
			r.run(t, hs)
			want, ok := doc[r.doc]
			switch {
			case !ok:
				t.Fatalf("row %q of docs/architecture.md section 3 does not exist", r.doc)
			case !Matches(want, hs.seen):
				t.Fatalf("docs/architecture.md section 3, row %q, says %q; the responses were %+v", r.doc, want, hs.seen)
			}
			seen[r.doc] = append(seen[r.doc], hs.seen...)
		})
	}
	return seen
}
