package idemfiberv3_test

import (
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemkey/idemkey/middleware"
	idemfiber "github.com/idemkey/idemkey/middleware/fiberv3"
	"github.com/idemkey/idemkey/middleware/internal/decisiontest"
)

func benchFiber(b *testing.B, mw func(*middleware.Middleware) fiber.Handler) http.Handler {
	app := fiber.New()
	app.Post("/pay", mw(decisiontest.NewBenchMiddleware(b)), func(c fiber.Ctx) error {
		c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
		return c.Status(http.StatusCreated).Send(decisiontest.BenchAnswer)
	})
	return serve(app)
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

// BenchmarkExecuteNetHTTP is the core alone on the first-execution path.
func BenchmarkExecuteNetHTTP(b *testing.B) {
	decisiontest.BenchExecute(b, decisiontest.NetHTTPBaseline(b))
}

// BenchmarkExecuteFiber is the first-execution path (a new key every
// iteration) through Fiber and the adapter.
func BenchmarkExecuteFiber(b *testing.B) {
	decisiontest.BenchExecute(b, benchFiber(b, idemfiber.Middleware))
}

// BenchmarkFiberAlone is the route without the middleware: what Fiber and the
// test's bridge cost on their own.
func BenchmarkFiberAlone(b *testing.B) {
	decisiontest.BenchExecute(b, benchFiber(b, func(*middleware.Middleware) fiber.Handler {
		return func(c fiber.Ctx) error { return c.Next() }
	}))
}
