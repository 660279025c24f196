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

// TestOuterHeadersNotReplayed: a header an outer middleware set before the
// adapter (a request id) belongs to each request, as with net/http: it is not
// stored, so the replay carries this request's value once, not the first
// request's beside it.
func TestOuterHeadersNotReplayed(t *testing.T) {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New()
	n := 0
	app.Use(func(c *fiber.Ctx) error {
		n++
		c.Set("X-Request-Id", fmt.Sprint("req-", n))
		return c.Next()
	})
	app.Post("/h", idemfiber.Middleware(m), func(c *fiber.Ctx) error {
		c.Set("X-Order", "o1")
		return c.Status(http.StatusCreated).SendString("ok")
	})
	h := serve(app)
	var got []string
	for range 2 {
		w := send(h, "POST", "/h", "ok1")
		got = append(got, fmt.Sprintf("%d %v %v %q", w.Code, w.Header()["X-Request-Id"], w.Header()["X-Order"], w.Header().Get("Idempotent-Replayed")))
	}
	if want := `[201 [req-1] [o1] "" 201 [req-2] [o1] "true"]`; fmt.Sprint(got) != want {
		t.Errorf("got %v, want %s", got, want)
	}
}

// TestRouteHandlersOwn404Replayed: with the adapter registered on the route
// itself, the route's handler returning fiber.ErrNotFound after its side
// effect is its answer, stored and replayed (not Fiber's no-route 404, which
// the adapter only sees when no handler follows it on its route).
func TestRouteHandlersOwn404Replayed(t *testing.T) {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New()
	runs := 0
	app.Post("/orders/:id/cancel", idemfiber.Middleware(m), func(c *fiber.Ctx) error {
		runs++
		return fiber.ErrNotFound
	})
	app.Use(idemfiber.Middleware(m)) // last: Fiber's own 404 still releases
	app.Post("/after", func(c *fiber.Ctx) error { runs++; return c.SendString("ran") })
	h := serve(app)
	var got []string
	for _, path := range []string{"/orders/7/cancel", "/orders/7/cancel", "/nowhere", "/nowhere"} {
		w := send(h, "POST", path, "k"+path[:3])
		got = append(got, fmt.Sprintf("%d %q", w.Code, w.Header().Get("Idempotent-Replayed")))
	}
	if want := `[404 "" 404 "true" 404 "" 404 ""]`; fmt.Sprint(got) != want || runs != 1 {
		t.Errorf("got %v, runs %d; want %s, runs 1", got, runs, want)
	}
}

// TestAppResponseSettingsKept: the adapter keeps the application's response
// settings: with DisableDefaultContentType, an answer without a Content-Type
// gets none, first and on replay.
func TestAppResponseSettingsKept(t *testing.T) {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New(fiber.Config{DisableDefaultContentType: true})
	app.Post("/h", idemfiber.Middleware(m), func(c *fiber.Ctx) error {
		return c.Status(http.StatusCreated).Send([]byte("ok"))
	})
	var got []string
	for range 2 {
		r := httptest.NewRequest("POST", "/h", nil)
		r.Header.Set("Idempotency-Key", "ct")
		resp, err := app.Test(r, -1)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d %q %q", resp.StatusCode, resp.Header["Content-Type"], resp.Header.Get("Idempotent-Replayed")))
	}
	if want := `[201 [] "" 201 [] "true"]`; fmt.Sprint(got) != want {
		t.Errorf("got %v, want %s", got, want)
	}
}

// TestKeysOutliveRecycledBuffers runs a real fasthttp server, whose request
// buffers are recycled across requests on kept-alive connections: the keys
// and bodies the store kept for many concurrent requests stay each request's
// own, so every retry replays its own answer and the key the handler saw was
// its own.
func TestKeysOutliveRecycledBuffers(t *testing.T) {
	m, err := middleware.New(memory.New(), middleware.ScopeFromHeader("X-Client-ID", "anon"))
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Post("/pay", idemfiber.Middleware(m), func(c *fiber.Ctx) error {
		id, _ := idemfiber.KeyFromContext(c)
		return c.Status(http.StatusCreated).SendString(id.Scope + "/" + id.Key + "/" + string(c.Body()))
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go app.Listener(ln) //nolint:errcheck // ends with Shutdown
	t.Cleanup(func() { _ = app.Shutdown() })
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	t.Cleanup(client.CloseIdleConnections)
	post := func(i int) (string, error) {
		key := fmt.Sprintf("key-%03d-%s", i, strings.Repeat("x", i%40))
		r, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/pay", strings.NewReader(fmt.Sprint(`{"n":`, i, `}`)))
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("X-Client-ID", fmt.Sprint("client-", i%7))
		resp, err := client.Do(r)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		want := fmt.Sprintf(`client-%d/%s/{"n":%d}`, i%7, key, i)
		if resp.StatusCode != http.StatusCreated || string(body) != want {
			return "", fmt.Errorf("request %d: %d %q, want 201 %q", i, resp.StatusCode, body, want)
		}
		return resp.Header.Get("Idempotent-Replayed"), nil
	}
	const n = 120
	for round, replayed := range []string{"", "true"} {
		errs := make(chan error, n)
		for i := range n {
			go func() {
				got, err := post(i)
				if err == nil && got != replayed {
					err = fmt.Errorf("round %d, request %d: replayed %q", round, i, got)
				}
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	}
}
