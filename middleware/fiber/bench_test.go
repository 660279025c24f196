package idemfiber_test

import (
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"

	"github.com/idemkey/idemkey/middleware"
	idemfiber "github.com/idemkey/idemkey/middleware/fiber"
	"github.com/idemkey/idemkey/middleware/internal/decisiontest"
)

func benchFiber(b *testing.B, mw func(*middleware.Middleware) fiber.Handler) http.Handler {
	app := fiber.New()
	app.Post("/pay", mw(decisiontest.NewBenchMiddleware(b)), func(c *fiber.Ctx) error {
		c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
		return c.Status(http.StatusCreated).Send(decisiontest.BenchAnswer)
	})
	return serve(app)
}

// viaAdaptor is the adapter built on Fiber's adaptor package instead
// (adaptor.HTTPHandler: fasthttpadaptor's request conversion and response
// writer), the alternative docs/adapters.md weighs. It is measured only: it
// keeps one value of a repeated header and aliases fasthttp's buffers.
func viaAdaptor(m *middleware.Middleware) fiber.Handler {
	return func(c *fiber.Ctx) error {
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c.SetUserContext(r.Context())
			if err := c.Next(); err != nil {
				_ = c.App().ErrorHandler(c, err)
			}
			resp := c.Response()
			resp.Header.VisitAll(func(k, v []byte) {
				if string(k) != fiber.HeaderContentLength {
					w.Header().Add(string(k), string(v))
				}
			})
			status, body := resp.StatusCode(), append([]byte(nil), resp.Body()...)
			resp.ResetBody()
			resp.Header.Reset()
			w.WriteHeader(status)
			w.Write(body)
		}))
		return adaptor.HTTPHandler(h)(c)
	}
}

// BenchmarkReplayNetHTTP is the core alone, the baseline of BenchmarkReplayFiber.
func BenchmarkReplayNetHTTP(b *testing.B) {
	decisiontest.BenchReplay(b, decisiontest.NetHTTPBaseline(b))
}

// BenchmarkReplayFiber is the same through Fiber and the adapter (and the
// test's net/http-to-fasthttp bridge, serve).
func BenchmarkReplayFiber(b *testing.B) {
	decisiontest.BenchReplay(b, benchFiber(b, idemfiber.Middleware))
}

// BenchmarkReplayFiberAdaptor is the replay through the adaptor-based variant.
func BenchmarkReplayFiberAdaptor(b *testing.B) {
	decisiontest.BenchReplay(b, benchFiber(b, viaAdaptor))
}

// BenchmarkExecuteNetHTTP is the core alone on the first-execution path.
func BenchmarkExecuteNetHTTP(b *testing.B) {
	decisiontest.BenchExecute(b, decisiontest.NetHTTPBaseline(b))
}

// BenchmarkExecuteFiber is the first-execution path (a new key every
// iteration) through Fiber and the adapter.
func BenchmarkExecuteFiber(b *testing.B) {
	decisiontest.BenchExecute(b, benchFiber(b, idemfiber.Middleware))
}

// BenchmarkExecuteFiberAdaptor is the first execution through the
// adaptor-based variant.
func BenchmarkExecuteFiberAdaptor(b *testing.B) {
	decisiontest.BenchExecute(b, benchFiber(b, viaAdaptor))
}

// BenchmarkFiberAlone is the route without the middleware: what Fiber and the
// test's bridge cost on their own.
func BenchmarkFiberAlone(b *testing.B) {
	decisiontest.BenchExecute(b, benchFiber(b, func(*middleware.Middleware) fiber.Handler {
		return func(c *fiber.Ctx) error { return c.Next() }
	}))
}
