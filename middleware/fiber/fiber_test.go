package idemfiber_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/valyala/fasthttp"

	"github.com/idemkey/idemkey/middleware"
	idemfiber "github.com/idemkey/idemkey/middleware/fiber"
	"github.com/idemkey/idemkey/middleware/internal/decisiontest"
	"github.com/idemkey/idemkey/store/memory"
)

// newServer is the decision table's router on Fiber v2: the adapter on the
// /api group, handler errors returned as *fiber.Error, and Fiber's recover
// middleware outside.
func newServer(t *testing.T, m *middleware.Middleware, a *decisiontest.App) http.Handler {
	app := fiber.New()
	app.Use(recover.New())
	g := app.Group("/api", idemfiber.Middleware(m))
	g.Post("/pay/:id", func(c *fiber.Ctx) error {
		id, ok := idemfiber.KeyFromContext(c)
		run, v := a.Pay(c.Params("id"), id, ok, c.Body())
		c.Set("X-Run", run)
		return c.Status(http.StatusCreated).JSON(v)
	})
	g.Post("/slow", func(c *fiber.Ctx) error { return c.SendString(a.Slow()) })
	g.Post("/flaky", func(c *fiber.Ctx) error {
		if a.Flaky() {
			return fiber.NewError(http.StatusServiceUnavailable, "try later")
		}
		return c.SendString("fine")
	})
	g.Post("/panic", func(c *fiber.Ctx) error {
		a.Panic()
		return c.SendString("fine")
	})
	g.Post("/large", func(c *fiber.Ctx) error { return c.SendString(a.Large()) })
	g.Post("/refuse", func(c *fiber.Ctx) error {
		a.Refuse()
		return fiber.NewError(http.StatusUnprocessableEntity, "no")
	})
	g.Get("/pay/:id", func(c *fiber.Ctx) error {
		_, ok := idemfiber.KeyFromContext(c)
		return c.SendString(a.Get(ok))
	})
	return serve(app)
}

// serve drives app with net/http requests, as a fasthttp server would: one
// fasthttp request per call, every header line kept (Fiber's own
// adaptor.FiberApp keeps only the last value of a repeated header, which would
// hide the table's two-keys row).
func serve(app *fiber.App) http.Handler {
	h := app.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(req)
		req.Header.SetMethod(r.Method)
		req.SetRequestURI(r.RequestURI)
		req.SetHost(r.Host)
		for k, vs := range r.Header {
			for _, v := range vs {
				req.Header.Add(k, v)
			}
		}
		if r.Body != nil {
			body, _ := io.ReadAll(r.Body)
			req.SetBody(body)
		}
		var fc fasthttp.RequestCtx
		fc.Init(req, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1234}, nil)
		h(&fc)
		fc.Response.Header.VisitAll(func(k, v []byte) {
			if string(k) != fiber.HeaderContentLength {
				w.Header().Add(string(k), string(v))
			}
		})
		w.WriteHeader(fc.Response.StatusCode())
		w.Write(fc.Response.Body())
	})
}

// TestDecisionTable runs the shared decision table (the one the net/http
// middleware, echo, gin run) through Fiber v2 and the adapter.
func TestDecisionTable(t *testing.T) { decisiontest.Run(t, newServer) }

func send(h http.Handler, method, path, key string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestNoRouteReleasesKey: Fiber's own 404 and 405 release the key, so the
// corrected request with the same key runs; a handler's own 404 is its answer
// and is replayed.
func TestNoRouteReleasesKey(t *testing.T) {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	app := fiber.New()
	app.Use(idemfiber.Middleware(m))
	app.Post("/pay", func(c *fiber.Ctx) error { runs++; return c.Status(http.StatusCreated).SendString("paid") })
	app.Get("/only-get", func(c *fiber.Ctx) error { return c.SendString("got") })
	app.Post("/missing", func(c *fiber.Ctx) error { runs++; return fiber.ErrNotFound })
	h := serve(app)
	var got []string
	for _, tc := range []struct{ path, key string }{
		{"/pya", "k1"}, {"/pay", "k1"}, // typo: Fiber's 404, then the corrected path runs
		{"/only-get", "k2"}, {"/pay", "k2"}, // wrong method: Fiber's 405, then the corrected request runs
		{"/missing", "k3"}, {"/missing", "k3"}, // the handler's own 404: stored, replayed
	} {
		w := send(h, "POST", tc.path, tc.key)
		got = append(got, fmt.Sprintf("%s %d %q", tc.path, w.Code, w.Header().Get("Idempotent-Replayed")))
	}
	want := `[/pya 404 "" /pay 201 "" /only-get 405 "" /pay 201 "" /missing 404 "" /missing 404 "true"]`
	if fmt.Sprint(got) != want || runs != 3 {
		t.Errorf("got %v, runs %d\nwant %s, runs 3", got, runs, want)
	}
}

// TestHeadersAndContext: every header line of the handler's answer (two
// Set-Cookie, a repeated custom header) reaches the client, the replay
// carries the repeated header (never the cookies: middleware's default), and the user
// context the application set outside reaches the handler with the key.
func TestHeadersAndContext(t *testing.T) {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	type ctxKey struct{}
	app := fiber.New()
	app.Use(func(c *fiber.Ctx) error {
		c.SetUserContext(context.WithValue(c.UserContext(), ctxKey{}, "outer"))
		return c.Next()
	})
	var seen []string
	app.Post("/h", idemfiber.Middleware(m), func(c *fiber.Ctx) error {
		id, _ := idemfiber.KeyFromContext(c)
		seen = append(seen, fmt.Sprint(c.UserContext().Value(ctxKey{}), " ", id.Key))
		c.Response().Header.Add("X-Multi", "a")
		c.Response().Header.Add("X-Multi", "b")
		c.Cookie(&fiber.Cookie{Name: "a", Value: "1"})
		c.Cookie(&fiber.Cookie{Name: "b", Value: "2"})
		return c.Status(http.StatusAccepted).SendString("ok")
	})
	h := serve(app)
	var answers []string
	for range 2 {
		w := send(h, "POST", "/h", "hk")
		answers = append(answers, fmt.Sprint(w.Code, w.Header()["X-Multi"], len(w.Header()["Set-Cookie"]), w.Body))
	}
	if fmt.Sprint(seen) != "[outer hk]" || answers[0] != "202 [a b] 2 ok" || answers[1] != "202 [a b] 0 ok" {
		t.Errorf("handler saw %v; answers %q", seen, answers)
	}
}

// TestThroughFasthttpServer sends requests through fasthttp's own server
// (app.Test), not the test bridge: a request with two Idempotency-Key lines
// is 400 (the adapter kept both), and the replay carries the stored answer.
func TestThroughFasthttpServer(t *testing.T) {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New()
	runs := 0
	app.Post("/pay", idemfiber.Middleware(m), func(c *fiber.Ctx) error {
		runs++
		return c.Status(http.StatusCreated).SendString(string(c.Body()))
	})
	var got []string
	for _, keys := range [][]string{{"a", "b"}, {"k"}, {"k"}} {
		r := httptest.NewRequest("POST", "/pay", strings.NewReader(`{"amountCents":1}`))
		for _, k := range keys {
			r.Header.Add("Idempotency-Key", k)
		}
		resp, err := app.Test(r)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		got = append(got, fmt.Sprint(resp.StatusCode, " ", resp.Header.Get("Idempotent-Replayed"), " ", string(body)))
	}
	if got[0][:3] != "400" || got[1] != `201  {"amountCents":1}` || got[2] != `201 true {"amountCents":1}` || runs != 1 {
		t.Errorf("got %q, runs %d", got, runs)
	}
}
