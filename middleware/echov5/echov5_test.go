package idemechov5_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v5"
	echomw "github.com/labstack/echo/v5/middleware"

	"github.com/idemkey/idemkey/middleware"
	idemechov5 "github.com/idemkey/idemkey/middleware/echov5"
	"github.com/idemkey/idemkey/middleware/internal/decisiontest"
	"github.com/idemkey/idemkey/store/memory"
)

// newServer is the decision table's router on echo v5: the adapter on the /api
// group, handler errors returned as *echo.HTTPError, echo's Recover outside. The
// error handler is echo's default plus a count in errs (nil: none).
func newServer(errs *atomic.Int64) decisiontest.Factory {
	return func(t *testing.T, m *middleware.Middleware, a *decisiontest.App) http.Handler {
		e := echo.New()
		e.Use(echomw.Recover()) // outside: turns a re-raised panic into a 500
		def := echo.DefaultHTTPErrorHandler(false)
		e.HTTPErrorHandler = func(c *echo.Context, err error) {
			if errs != nil {
				errs.Add(1)
			}
			def(c, err)
		}
		g := e.Group("/api", idemechov5.Middleware(m))
		g.POST("/pay/:id", func(c *echo.Context) error {
			id, ok := idemechov5.KeyFromContext(c)
			body, _ := io.ReadAll(c.Request().Body)
			run, v := a.Pay(c.Param("id"), id, ok, body)
			c.Response().Header().Set("X-Run", run)
			return c.JSON(http.StatusCreated, v)
		})
		g.POST("/slow", func(c *echo.Context) error { return c.String(http.StatusOK, a.Slow()) })
		g.POST("/flaky", func(c *echo.Context) error {
			if a.Flaky() {
				return echo.NewHTTPError(http.StatusServiceUnavailable, "try later")
			}
			return c.String(http.StatusOK, "fine")
		})
		g.POST("/panic", func(c *echo.Context) error {
			a.Panic()
			return c.String(http.StatusOK, "fine")
		})
		g.POST("/large", func(c *echo.Context) error { return c.String(http.StatusOK, a.Large()) })
		g.POST("/refuse", func(c *echo.Context) error {
			a.Refuse()
			return echo.NewHTTPError(http.StatusUnprocessableEntity, "no")
		})
		g.GET("/pay/:id", func(c *echo.Context) error {
			_, ok := idemechov5.KeyFromContext(c)
			return c.String(http.StatusOK, a.Get(ok))
		})
		return e
	}
}

// TestDecisionTable runs the shared decision table (the one the net/http
// middleware, echo v4 and gin run) through echo v5 and the adapter.
func TestDecisionTable(t *testing.T) { decisiontest.Run(t, newServer(nil)) }

func send(h http.Handler, method, path, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestNotFoundStaysEcho: echo's own 404 still comes from echo's error handler,
// rendered inside the middleware and then returned up the chain, so the second
// call sees a committed response and writes nothing.
func TestNotFoundStaysEcho(t *testing.T) {
	var errs atomic.Int64
	m, a := decisiontest.New(t)
	h := newServer(&errs)(t, m, a)
	w := send(h, "GET", "/api/nowhere", "")
	if w.Code != 404 || w.Body.String() != `{"message":"Not Found"}`+"\n" || errs.Load() != 2 {
		t.Errorf("404: %d %q, error handler calls %d", w.Code, w.Body, errs.Load())
	}
}

// TestResponseRestored checks that outer echo middleware sees its own writer,
// whose *echo.Response has the status and size sent, for executions and replays.
func TestResponseRestored(t *testing.T) {
	var got []string
	outer := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			w := c.Response()
			err := next(c)
			r, uerr := echo.UnwrapResponse(c.Response())
			if uerr != nil {
				t.Fatal(uerr)
			}
			got = append(got, fmt.Sprint(c.Response() == w, r.Status, r.Size, r.Committed))
			return err
		}
	}
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.POST("/wrapped", func(c *echo.Context) error { return c.String(202, "ok") }, outer, idemechov5.Middleware(m))
	for range 2 {
		send(e, "POST", "/wrapped", "w")
	}
	if fmt.Sprint(got) != "[true 202 2 true true 202 2 true]" {
		t.Errorf("outer middleware saw (own writer, status, size, committed) %v", got)
	}
}

// TestNoRouteReleasesKey: echo's own 404 (a group's catch-all) and 405 release
// the key, so the corrected request with the same key runs; a handler's own
// 404 is the application's answer and is replayed.
func TestNoRouteReleasesKey(t *testing.T) {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	runs := 0
	g := e.Group("/api", idemechov5.Middleware(m))
	g.POST("/pay", func(c *echo.Context) error { runs++; return c.String(http.StatusCreated, "paid") })
	g.GET("/only-get", func(c *echo.Context) error { return c.String(http.StatusOK, "got") })
	g.POST("/missing", func(c *echo.Context) error { runs++; return echo.ErrNotFound })
	var got []string
	for _, tc := range []struct{ path, key string }{
		{"/api/pya", "k1"}, {"/api/pay", "k1"}, // typo: echo's 404, then the corrected path runs
		{"/api/only-get", "k2"}, {"/api/pay", "k2"}, // wrong method: echo answers 404 (the group catch-all), then the corrected request runs
		{"/api/missing", "k3"}, {"/api/missing", "k3"}, // the handler's own 404: stored, replayed
	} {
		w := send(e, "POST", tc.path, tc.key)
		got = append(got, fmt.Sprintf("%s %d %q", tc.path, w.Code, w.Header().Get("Idempotent-Replayed")))
	}
	want := `[/api/pya 404 "" /api/pay 201 "" /api/only-get 404 "" /api/pay 201 "" /api/missing 404 "" /api/missing 404 "true"]`
	if fmt.Sprint(got) != want || runs != 3 {
		t.Errorf("got %v, runs %d\nwant %s, runs 3", got, runs, want)
	}

	// Global middleware (e.Use) sees echo's 405 and its 404 without a group.
	e = echo.New()
	e.Use(idemechov5.Middleware(m))
	e.GET("/only-get", func(c *echo.Context) error { return c.String(http.StatusOK, "got") })
	e.POST("/pay", func(c *echo.Context) error { runs++; return c.String(http.StatusCreated, "paid") })
	got = nil
	for _, tc := range []struct{ path, key string }{{"/only-get", "g1"}, {"/pay", "g1"}, {"/nowhere", "g2"}, {"/pay", "g2"}} {
		w := send(e, "POST", tc.path, tc.key)
		got = append(got, fmt.Sprintf("%s %d", tc.path, w.Code))
	}
	if want := "[/only-get 405 /pay 201 /nowhere 404 /pay 201]"; fmt.Sprint(got) != want {
		t.Errorf("global: got %v, want %s", got, want)
	}
}
