package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	idem2 "github.com/gofiber/fiber/v2/middleware/idempotency"
	fiberredis "github.com/gofiber/storage/redis/v3"
	"github.com/valyala/fasthttp"

	"github.com/idemkey/idemkey/benchmarks/internal/httpload"
	"github.com/idemkey/idemkey/internal/cputime"
	idemfiber "github.com/idemkey/idemkey/middleware/fiber"
)

// BenchmarkReplayHandler is a replay's server-side cost without HTTP on a
// socket: each subject's handler called in this process on one prepared
// request (Fiber's app.Handler on a fasthttp.RequestCtx, idemkey's net/http
// middleware on an httptest recorder), its store on a private Redis. cpu-ns/op
// is this process's CPU time per replay (the Redis client's syscalls included,
// redis-server's not), which load on the machine stretches less than ns/op:
//
//	go test -run '^$' -bench ReplayHandler -count 8 -benchmem ./endtoend
func BenchmarkReplayHandler(b *testing.B) {
	addr, stop, err := startRedis()
	if err != nil {
		b.Skip("no redis-server:", err)
	}
	b.Cleanup(stop)
	body := httpload.JSONBody(128)
	for _, sub := range []string{"fiber-redis", "idemkey-fiber-redis", "redis"} {
		b.Run(sub, func(b *testing.B) {
			cfg := serveConfig{redisAddr: addr, prefix: "bench:" + sub + ":"}
			if sub == "redis" {
				benchNetHTTP(b, cfg, body)
				return
			}
			benchFiber(b, sub, cfg, body)
		})
	}
}

func benchFiber(b *testing.B, sub string, cfg serveConfig, body []byte) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	var mw fiber.Handler
	if sub == "fiber-redis" {
		st := fiberredis.New(fiberredis.Config{Addrs: []string{cfg.redisAddr}, PoolSize: 64})
		mw = idem2.New(idem2.Config{KeyHeader: "Idempotency-Key", Lifetime: 24 * time.Hour, Storage: st})
	} else {
		mw = idemfiber.Middleware(newMiddleware("redis", cfg))
	}
	app.Post("/api/transfers", mw, func(c *fiber.Ctx) error {
		_ = c.Body()
		c.Set("Content-Type", "application/json")
		return c.Status(http.StatusCreated).Send(answer)
	})
	h := app.Handler()
	var req fasthttp.Request
	req.Header.SetMethod("POST")
	req.SetRequestURI("/api/transfers")
	req.Header.SetHost("127.0.0.1")
	req.Header.SetContentType("application/json")
	req.Header.Set("Idempotency-Key", newKey(1, 2, 3))
	req.SetBody(body)
	var fc fasthttp.RequestCtx
	conn := fakeConn{remote: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}}
	send := func() {
		// What fasthttp's server does before each request of a connection: its
		// buffers kept (no ReduceMemoryUsage), the response reset.
		fc.Init2(conn, nil, false)
		req.CopyTo(&fc.Request)
		fc.Response.Reset()
		h(&fc)
		if fc.Response.StatusCode() != http.StatusCreated {
			b.Fatal(fc.Response.StatusCode(), string(fc.Response.Body()))
		}
	}
	send() // the first execution
	measure(b, send)
}

func benchNetHTTP(b *testing.B, cfg serveConfig, body []byte) {
	h := newMiddleware("redis", cfg).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(answer)
	}))
	r := httptest.NewRequest("POST", "/api/transfers", nil)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", newKey(1, 2, 3))
	rd := strings.NewReader("")
	r.Body, r.ContentLength = readCloser{rd}, int64(len(body))
	send := func() {
		rd.Reset(string(body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatal(w.Code, w.Body.String())
		}
	}
	send()
	measure(b, send)
}

// fakeConn is the connection a request arrived on: only its addresses.
type fakeConn struct {
	net.Conn
	remote net.Addr
}

func (c fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c fakeConn) LocalAddr() net.Addr  { return c.remote }

type readCloser struct{ *strings.Reader }

func (readCloser) Close() error { return nil }

// measure runs send in b.Loop and reports this process's CPU time per op.
func measure(b *testing.B, send func()) {
	b.ReportAllocs()
	defer cputime.PerOp(b)()
	for b.Loop() {
		send()
	}
}
