package idemecho_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemkey/idemkey/middleware"
	idemecho "github.com/idemkey/idemkey/middleware/echo"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// failingStore fails every Claim while down is set.
type failingStore struct {
	store.Store
	down atomic.Bool
}

func (f *failingStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if f.down.Load() {
		return store.ClaimResult{}, errors.New("connection refused")
	}
	return f.Store.Claim(ctx, req)
}

// app is an echo server with the middleware on /api and handlers counting runs.
type app struct {
	e       *echo.Echo
	st      *failingStore
	skew    atomic.Int64       // added to the store's clock, in nanoseconds
	runs    sync.Map           // route label -> *atomic.Int64
	entered chan chan struct{} // a slow handler sends the channel that releases it
	fail    atomic.Int64       // answer 503 while > 0 (decremented per run)
	errs    atomic.Int64       // calls of the HTTPErrorHandler
}

func (a *app) count(label string) int64 {
	v, _ := a.runs.LoadOrStore(label, new(atomic.Int64))
	return v.(*atomic.Int64).Load()
}

func (a *app) ran(label string) {
	v, _ := a.runs.LoadOrStore(label, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func newApp(t *testing.T, opts ...middleware.Option) *app {
	t.Helper()
	a := &app{e: echo.New(), entered: make(chan chan struct{})}
	a.st = &failingStore{Store: memory.New(memory.WithClock(func() time.Time { return time.Now().Add(time.Duration(a.skew.Load())) }))}
	m, err := middleware.New(a.st, middleware.ScopeFromHeader("X-Client-ID", "anonymous"), append([]middleware.Option{
		middleware.WithMaxRequestBody(64), middleware.WithMaxStoredBody(128), middleware.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	a.e.Use(recoverToError) // outside: turns a re-raised panic into a 500
	// The error handler is echo's default plus a count: it must keep working.
	a.e.HTTPErrorHandler = func(err error, c echo.Context) {
		a.errs.Add(1)
		a.e.DefaultHTTPErrorHandler(err, c)
	}
	g := a.e.Group("/api", idemecho.Middleware(m))
	g.POST("/pay/:id", func(c echo.Context) error {
		a.ran("pay")
		id, ok := idemecho.KeyFromContext(c)
		body, _ := io.ReadAll(c.Request().Body)
		c.Response().Header().Set("X-Run", fmt.Sprint(a.count("pay")))
		return c.JSON(http.StatusCreated, map[string]any{"id": c.Param("id"), "key": id.Key, "scope": id.Scope, "keyed": ok, "body": string(body)})
	})
	g.POST("/slow", func(c echo.Context) error {
		a.ran("slow")
		run := a.count("slow")
		release := make(chan struct{})
		a.entered <- release
		<-release
		return c.String(http.StatusOK, fmt.Sprint("slow run ", run))
	})
	g.POST("/flaky", func(c echo.Context) error {
		a.ran("flaky")
		if a.fail.Add(-1) >= 0 {
			return echo.NewHTTPError(http.StatusServiceUnavailable, "try later")
		}
		return c.String(http.StatusOK, "fine")
	})
	g.POST("/panic", func(c echo.Context) error {
		a.ran("panic")
		if a.fail.Add(-1) >= 0 {
			panic("handler bug")
		}
		return c.String(http.StatusOK, "fine")
	})
	g.POST("/large", func(c echo.Context) error {
		a.ran("large")
		return c.String(http.StatusOK, strings.Repeat("L", 200))
	})
	g.POST("/refuse", func(c echo.Context) error {
		a.ran("refuse")
		return echo.NewHTTPError(http.StatusUnprocessableEntity, "no")
	})
	g.GET("/pay/:id", func(c echo.Context) error {
		a.ran("get")
		_, ok := idemecho.KeyFromContext(c)
		return c.String(http.StatusOK, fmt.Sprint("keyed=", ok))
	})
	return a
}

// recoverToError is echo middleware that turns a panic into an error answered by
// echo's error handler, like echo's middleware.Recover (whose package needs a
// module this one does not require).
func recoverToError(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("recovered: %v", p)
				c.Error(err)
			}
		}()
		return next(c)
	}
}

type req struct {
	method, path, key, body, client string
	keys                            []string // several header lines
}

func (a *app) do(r req) *httptest.ResponseRecorder {
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
	a.e.ServeHTTP(w, hr)
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

// TestDecisionTable drives every row of the decision table once through echo.
func TestDecisionTable(t *testing.T) {
	pay := req{method: "POST", path: "/api/pay/7", key: `"k-1"`, body: `{"n":1}`, client: "alice"}
	tests := []struct {
		name string
		run  func(t *testing.T, a *app)
	}{
		{"new key runs once, retry replayed with marker", func(t *testing.T, a *app) {
			first := a.do(pay)
			if first.Code != 201 || first.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("first: %d %v %s", first.Code, first.Header(), first.Body)
			}
			want := `{"body":"{\"n\":1}","id":"7","key":"k-1","keyed":true,"scope":"alice"}` + "\n"
			if first.Body.String() != want {
				t.Errorf("body %q, want %q (key, scope, param and body reach the handler)", first.Body, want)
			}
			again := a.do(pay)
			if again.Code != 201 || again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != want ||
				again.Header().Get("X-Run") != "1" || again.Header().Get("Content-Type") != first.Header().Get("Content-Type") {
				t.Errorf("replay: %d %v %q", again.Code, again.Header(), again.Body)
			}
			if n := a.count("pay"); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
			other := pay
			other.client = "bob" // another scope: its own record
			if w := a.do(other); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
				t.Errorf("other scope: %d %v", w.Code, w.Header())
			}
		}},
		{"same key while running is 409 with Retry-After", func(t *testing.T, a *app) {
			slow := req{method: "POST", path: "/api/slow", key: "s", body: "x"}
			done := make(chan *httptest.ResponseRecorder)
			go func() { done <- a.do(slow) }()
			release := <-a.entered
			w := a.do(slow)
			problemCode(t, w, 409, middleware.CodeInFlight)
			if w.Header().Get("Retry-After") == "" {
				t.Error("409 without Retry-After")
			}
			close(release)
			if first := <-done; first.Code != 200 || first.Body.String() != "slow run 1" {
				t.Errorf("original: %d %s", first.Code, first.Body)
			}
			if n := a.count("slow"); n != 1 {
				t.Errorf("handler ran %d times", n)
			}
		}},
		{"same key, other body is 422", func(t *testing.T, a *app) {
			a.do(pay)
			other := pay
			other.body = `{"n":2}`
			problemCode(t, a.do(other), 422, middleware.CodeMismatch)
			if w := a.do(pay); w.Header().Get("Idempotent-Replayed") != "true" {
				t.Error("the stored record changed after a mismatch")
			}
			if n := a.count("pay"); n != 1 {
				t.Errorf("handler ran %d times", n)
			}
		}},
		{"missing key is 400", func(t *testing.T, a *app) {
			problemCode(t, a.do(req{method: "POST", path: "/api/pay/1", body: "{}"}), 400, middleware.CodeKeyMissing)
		}},
		{"invalid keys are 400", func(t *testing.T, a *app) {
			for _, r := range []req{
				{method: "POST", path: "/api/pay/1", key: `"unterminated`},
				{method: "POST", path: "/api/pay/1", key: strings.Repeat("k", 256)},
				{method: "POST", path: "/api/pay/1", keys: []string{"a", "b"}},
			} {
				problemCode(t, a.do(r), 400, middleware.CodeKeyInvalid)
			}
		}},
		{"body over the limit is 413", func(t *testing.T, a *app) {
			problemCode(t, a.do(req{method: "POST", path: "/api/pay/1", key: "big", body: strings.Repeat("x", 65)}), 413, middleware.CodeRequestTooLarge)
		}},
		{"handler error 5xx releases, the retry runs, then replays", func(t *testing.T, a *app) {
			a.fail.Store(1)
			r := req{method: "POST", path: "/api/flaky", key: "f"}
			if w := a.do(r); w.Code != 503 || !strings.Contains(w.Body.String(), "try later") {
				t.Fatalf("first: %d %s (echo's error handler must render the error)", w.Code, w.Body)
			}
			if w := a.do(r); w.Code != 200 || w.Body.String() != "fine" || w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("retry: %d %v %s", w.Code, w.Header(), w.Body)
			}
			if w := a.do(r); w.Code != 200 || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("third: %d %v", w.Code, w.Header())
			}
			if n := a.count("flaky"); n != 2 {
				t.Errorf("handler ran %d times, want 2", n)
			}
		}},
		{"handler error 4xx is rendered once, stored and replayed", func(t *testing.T, a *app) {
			r := req{method: "POST", path: "/api/refuse", key: "r"}
			first := a.do(r)
			if first.Code != 422 || !strings.Contains(first.Body.String(), `"message":"no"`) {
				t.Fatalf("first: %d %s", first.Code, first.Body)
			}
			again := a.do(r)
			if again.Code != 422 || again.Body.String() != first.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay: %d %v %s", again.Code, again.Header(), again.Body)
			}
			if n := a.count("refuse"); n != 1 {
				t.Errorf("handler ran %d times", n)
			}
		}},
		{"store error is 503 with Retry-After; handler not run", func(t *testing.T, a *app) {
			a.st.down.Store(true)
			w := a.do(pay)
			problemCode(t, w, 503, middleware.CodeStoreUnavailable)
			if w.Header().Get("Retry-After") == "" {
				t.Error("503 without Retry-After")
			}
			if n := a.count("pay"); n != 0 {
				t.Errorf("handler ran %d times", n)
			}
		}},
		{"panic releases and re-panics, the retry runs", func(t *testing.T, a *app) {
			a.fail.Store(1)
			r := req{method: "POST", path: "/api/panic", key: "p"}
			if w := a.do(r); w.Code != 500 {
				t.Fatalf("panic: %d %s (echo's Recover answers 500)", w.Code, w.Body)
			}
			if w := a.do(r); w.Code != 200 || w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("retry: %d %v", w.Code, w.Header())
			}
			if n := a.count("panic"); n != 2 {
				t.Errorf("handler ran %d times, want 2", n)
			}
		}},
		{"response over the storage cap streams, replay omits the body", func(t *testing.T, a *app) {
			r := req{method: "POST", path: "/api/large", key: "l"}
			if w := a.do(r); w.Code != 200 || w.Body.Len() != 200 {
				t.Fatalf("first: %d, %d bytes", w.Code, w.Body.Len())
			}
			w := a.do(r)
			if w.Code != 200 || w.Body.Len() != 0 || w.Header().Get("Idempotency-Replay") != "omitted" || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay: %d %v %q", w.Code, w.Header(), w.Body)
			}
			if n := a.count("large"); n != 1 {
				t.Errorf("handler ran %d times", n)
			}
		}},
		{"expired lease is taken over; the stale holder's completion is refused", func(t *testing.T, a *app) {
			slow := req{method: "POST", path: "/api/slow", key: "s", body: "x"}
			stale := make(chan *httptest.ResponseRecorder)
			go func() { stale <- a.do(slow) }()
			release1 := <-a.entered
			a.skew.Store(int64(time.Hour)) // the holder's lease is over on the store's clock
			second := make(chan *httptest.ResponseRecorder)
			go func() { second <- a.do(slow) }()
			release2 := <-a.entered // the takeover runs the handler once more
			close(release2)
			w2 := <-second
			close(release1)
			w1 := <-stale
			if w1.Body.String() != "slow run 1" || w2.Body.String() != "slow run 2" || a.count("slow") != 2 {
				t.Fatalf("holders answered %q and %q, runs %d", w1.Body, w2.Body, a.count("slow"))
			}
			if w := a.do(slow); w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "slow run 2" {
				t.Errorf("replay after the takeover: %d %v %q, want the new holder's answer", w.Code, w.Header(), w.Body)
			}
		}},
		{"GET passes through, key ignored", func(t *testing.T, a *app) {
			for range 2 {
				w := a.do(req{method: "GET", path: "/api/pay/1", key: "g"})
				if w.Code != 200 || w.Body.String() != "keyed=false" || w.Header().Get("Idempotent-Replayed") != "" {
					t.Fatalf("GET: %d %v %s", w.Code, w.Header(), w.Body)
				}
			}
			if n := a.count("get"); n != 2 {
				t.Errorf("GET handler ran %d times, want 2", n)
			}
		}},
		{"echo's 404 still comes from echo", func(t *testing.T, a *app) {
			w := a.do(req{method: "GET", path: "/api/nowhere"})
			// The error is rendered inside the middleware, then returned up the chain
			// (echo's convention): the second call sees a committed response.
			if w.Code != 404 || w.Body.String() != `{"message":"Not Found"}`+"\n" || a.errs.Load() != 2 {
				t.Errorf("404: %d %q, error handler calls %d", w.Code, w.Body, a.errs.Load())
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newApp(t)) })
	}
}

// TestResponseRestored checks that outer echo middleware sees echo's own Response,
// with the status and size sent, for executions and replays.
func TestResponseRestored(t *testing.T) {
	a := newApp(t)
	var statuses []int
	var same []bool
	outer := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			resp := c.Response()
			err := next(c)
			statuses = append(statuses, c.Response().Status)
			same = append(same, c.Response() == resp && c.Response().Committed && c.Response().Size > 0)
			return err
		}
	}
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	a.e.POST("/wrapped", func(c echo.Context) error { return c.String(202, "ok") }, outer, idemecho.Middleware(m))
	for range 2 {
		a.do(req{method: "POST", path: "/wrapped", key: "w"})
	}
	if fmt.Sprint(statuses) != "[202 202]" || fmt.Sprint(same) != "[true true]" {
		t.Errorf("outer middleware saw statuses %v, own committed response %v", statuses, same)
	}
}

// TestOptionalKey: where the key is optional, a request without one runs
// unprotected and nothing is stored.
func TestOptionalKey(t *testing.T) {
	a := newApp(t, middleware.WithKeyRequired(false))
	for range 2 {
		w := a.do(req{method: "POST", path: "/api/pay/1", body: "{}"})
		if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" || !strings.Contains(w.Body.String(), `"keyed":false`) {
			t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body)
		}
	}
	if n := a.count("pay"); n != 2 {
		t.Errorf("handler ran %d times, want 2", n)
	}
}
