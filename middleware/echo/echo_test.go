package idemecho_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemkey/idemkey/middleware"
	idemecho "github.com/idemkey/idemkey/middleware/echo"
	"github.com/idemkey/idemkey/middleware/internal/decisiontest"
	"github.com/idemkey/idemkey/store/memory"
)

// newServer is the decision table's router on echo v4: the adapter on the /api
// group, handler errors returned as *echo.HTTPError, and a recover outside. The
// error handler is echo's default plus a count in errs (nil: none).
func newServer(errs *atomic.Int64) decisiontest.Factory {
	return func(t *testing.T, m *middleware.Middleware, a *decisiontest.App) http.Handler {
		e := echo.New()
		e.Use(recoverToError) // outside: turns a re-raised panic into a 500
		e.HTTPErrorHandler = func(err error, c echo.Context) {
			if errs != nil {
				errs.Add(1)
			}
			e.DefaultHTTPErrorHandler(err, c)
		}
		g := e.Group("/api", idemecho.Middleware(m))
		g.POST("/pay/:id", func(c echo.Context) error {
			id, ok := idemecho.KeyFromContext(c)
			body, _ := io.ReadAll(c.Request().Body)
			run, v := a.Pay(c.Param("id"), id, ok, body)
			c.Response().Header().Set("X-Run", run)
			return c.JSON(http.StatusCreated, v)
		})
		g.POST("/slow", func(c echo.Context) error { return c.String(http.StatusOK, a.Slow()) })
		g.POST("/flaky", func(c echo.Context) error {
			if a.Flaky() {
				return echo.NewHTTPError(http.StatusServiceUnavailable, "try later")
			}
			return c.String(http.StatusOK, "fine")
		})
		g.POST("/panic", func(c echo.Context) error {
			a.Panic()
			return c.String(http.StatusOK, "fine")
		})
		g.POST("/large", func(c echo.Context) error { return c.String(http.StatusOK, a.Large()) })
		g.POST("/refuse", func(c echo.Context) error {
			a.Refuse()
			return echo.NewHTTPError(http.StatusUnprocessableEntity, "no")
		})
		g.GET("/pay/:id", func(c echo.Context) error {
			_, ok := idemecho.KeyFromContext(c)
			return c.String(http.StatusOK, a.Get(ok))
		})
		return e
	}
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

// TestDecisionTable runs the shared decision table (the one the net/http
// middleware, echo v5 and gin run) through echo v4 and the adapter.
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
// rendered inside the middleware and then returned up the chain (echo's
// convention), so the second call sees a committed response and writes nothing.
func TestNotFoundStaysEcho(t *testing.T) {
	var errs atomic.Int64
	m, a := decisiontest.New(t)
	h := newServer(&errs)(t, m, a)
	w := send(h, "GET", "/api/nowhere", "")
	if w.Code != 404 || w.Body.String() != `{"message":"Not Found"}`+"\n" || errs.Load() != 2 {
		t.Errorf("404: %d %q, error handler calls %d", w.Code, w.Body, errs.Load())
	}
}

// TestResponseRestored checks that outer echo middleware sees echo's own Response,
// with the status and size sent, for executions and replays.
func TestResponseRestored(t *testing.T) {
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
	e := echo.New()
	e.POST("/wrapped", func(c echo.Context) error { return c.String(202, "ok") }, outer, idemecho.Middleware(m))
	for range 2 {
		send(e, "POST", "/wrapped", "w")
	}
	if fmt.Sprint(statuses) != "[202 202]" || fmt.Sprint(same) != "[true true]" {
		t.Errorf("outer middleware saw statuses %v, own committed response %v", statuses, same)
	}
}

// TestNoRouteReleasesKey: echo's own 404 (no route, a group's catch-all) and
// 405 release the key, so the corrected request with the same key runs; a
// handler's own 404, and a catch-all route of the application's, are its
// answers and are replayed.
func TestNoRouteReleasesKey(t *testing.T) {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	e := echo.New()
	g := e.Group("/api", idemecho.Middleware(m))
	g.POST("/pay", func(c echo.Context) error { runs++; return c.String(http.StatusCreated, "paid") })
	g.GET("/only-get", func(c echo.Context) error { return c.String(http.StatusOK, "got") })
	g.POST("/missing", func(c echo.Context) error { runs++; return echo.ErrNotFound })
	g.POST("/files/*", func(c echo.Context) error { runs++; return c.String(http.StatusNotFound, "no file") })
	var got []string
	for _, tc := range []struct{ path, key string }{
		{"/api/pya", "k1"}, {"/api/pay", "k1"}, // typo: echo's 404, then the corrected path runs
		{"/api/only-get", "k2"}, {"/api/pay", "k2"}, // wrong method: echo answers 404 (the group's catch-all), then the corrected request runs
		{"/api/missing", "k3"}, {"/api/missing", "k3"}, // the handler's own 404: stored, replayed
		{"/api/files/a", "k4"}, {"/api/files/a", "k4"}, // the application's catch-all: stored, replayed
	} {
		w := send(e, "POST", tc.path, tc.key)
		got = append(got, fmt.Sprintf("%s %d %q", tc.path, w.Code, w.Header().Get("Idempotent-Replayed")))
	}
	want := `[/api/pya 404 "" /api/pay 201 "" /api/only-get 404 "" /api/pay 201 "" /api/missing 404 "" /api/missing 404 "true" /api/files/a 404 "" /api/files/a 404 "true"]`
	if fmt.Sprint(got) != want || runs != 4 {
		t.Errorf("got %v, runs %d\nwant %s, runs 4", got, runs, want)
	}

	// Global middleware (e.Use) sees echo's 405 and its 404 without a group, and
	// a host's router is the one looked up.
	for _, host := range []string{"", "api.example"} {
		e = echo.New()
		e.Use(idemecho.Middleware(m))
		add := e.Add
		if host != "" {
			add = e.Host(host).Add
		}
		add(http.MethodGet, "/only-get", func(c echo.Context) error { return c.String(http.StatusOK, "got") })
		add(http.MethodPost, "/pay", func(c echo.Context) error { runs++; return c.String(http.StatusCreated, "paid") })
		add(http.MethodPost, "/gone", func(c echo.Context) error { return c.String(http.StatusNotFound, "gone") })
		got = nil
		for _, tc := range []struct{ path, key string }{{"/only-get", "g1"}, {"/pay", "g1"}, {"/nowhere", "g2"}, {"/pay", "g2"}, {"/gone", "g3"}, {"/gone", "g3"}} {
			r := httptest.NewRequest("POST", tc.path, nil)
			r.Host = host
			r.Header.Set("Idempotency-Key", host+tc.key)
			w := httptest.NewRecorder()
			e.ServeHTTP(w, r)
			got = append(got, fmt.Sprintf("%s %d %q", tc.path, w.Code, w.Header().Get("Idempotent-Replayed")))
		}
		if want := `[/only-get 405 "" /pay 201 "" /nowhere 404 "" /pay 201 "" /gone 404 "" /gone 404 "true"]`; fmt.Sprint(got) != want {
			t.Errorf("global, host %q: got %v, want %s", host, got, want)
		}
	}
}
