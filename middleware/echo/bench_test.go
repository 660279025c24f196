package idemecho_test

import (
	"testing"

	"github.com/labstack/echo/v4"

	idemecho "github.com/idemkey/idemkey/middleware/echo"
	"github.com/idemkey/idemkey/middleware/internal/decisiontest"
)

func benchEcho(b *testing.B) *echo.Echo {
	e := echo.New()
	e.POST("/pay", func(c echo.Context) error { return c.Blob(201, "application/json", decisiontest.BenchAnswer) },
		idemecho.Middleware(decisiontest.NewBenchMiddleware(b)))
	return e
}

// BenchmarkReplayNetHTTP is the core alone, the baseline of BenchmarkReplayEcho.
func BenchmarkReplayNetHTTP(b *testing.B) {
	decisiontest.BenchReplay(b, decisiontest.NetHTTPBaseline(b))
}

// BenchmarkReplayEcho is the same through echo and the adapter.
func BenchmarkReplayEcho(b *testing.B) { decisiontest.BenchReplay(b, benchEcho(b)) }

// BenchmarkExecuteNetHTTP is the core alone on the first-execution path.
func BenchmarkExecuteNetHTTP(b *testing.B) {
	decisiontest.BenchExecute(b, decisiontest.NetHTTPBaseline(b))
}

// BenchmarkExecuteEcho is the first-execution path (a new key every iteration)
// through echo and the adapter.
func BenchmarkExecuteEcho(b *testing.B) { decisiontest.BenchExecute(b, benchEcho(b)) }
