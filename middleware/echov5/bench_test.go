package idemechov5_test

import (
	"testing"

	"github.com/labstack/echo/v5"

	idemechov5 "github.com/idemkey/idemkey/middleware/echov5"
	"github.com/idemkey/idemkey/middleware/internal/decisiontest"
)

func benchEcho(b *testing.B) *echo.Echo {
	e := echo.New()
	e.POST("/pay", func(c *echo.Context) error { return c.Blob(201, "application/json", decisiontest.BenchAnswer) },
		idemechov5.Middleware(decisiontest.NewBenchMiddleware(b)))
	return e
}

// BenchmarkReplayNetHTTP is the core alone, the baseline of BenchmarkReplayEchoV5.
func BenchmarkReplayNetHTTP(b *testing.B) {
	decisiontest.BenchReplay(b, decisiontest.NetHTTPBaseline(b))
}

// BenchmarkReplayEchoV5 is the same through echo v5 and the adapter.
func BenchmarkReplayEchoV5(b *testing.B) { decisiontest.BenchReplay(b, benchEcho(b)) }

// BenchmarkExecuteNetHTTP is the core alone on the first-execution path.
func BenchmarkExecuteNetHTTP(b *testing.B) {
	decisiontest.BenchExecute(b, decisiontest.NetHTTPBaseline(b))
}

// BenchmarkExecuteEchoV5 is the first-execution path (a new key every iteration)
// through echo v5 and the adapter.
func BenchmarkExecuteEchoV5(b *testing.B) { decisiontest.BenchExecute(b, benchEcho(b)) }
