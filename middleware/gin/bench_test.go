package idemgin_test

import (
	"testing"

	"github.com/gin-gonic/gin"

	idemgin "github.com/idemkey/idemkey/middleware/gin"
	"github.com/idemkey/idemkey/middleware/internal/decisiontest"
)

func benchGin(b *testing.B) *gin.Engine {
	r := gin.New()
	r.POST("/pay", idemgin.Middleware(decisiontest.NewBenchMiddleware(b)),
		func(c *gin.Context) { c.Data(201, "application/json", decisiontest.BenchAnswer) })
	return r
}

// BenchmarkReplayNetHTTP is the core alone, the baseline of BenchmarkReplayGin.
func BenchmarkReplayNetHTTP(b *testing.B) {
	decisiontest.BenchReplay(b, decisiontest.NetHTTPBaseline(b))
}

// BenchmarkReplayGin is the same through gin and the adapter.
func BenchmarkReplayGin(b *testing.B) { decisiontest.BenchReplay(b, benchGin(b)) }

// BenchmarkExecuteNetHTTP is the core alone on the first-execution path.
func BenchmarkExecuteNetHTTP(b *testing.B) {
	decisiontest.BenchExecute(b, decisiontest.NetHTTPBaseline(b))
}

// BenchmarkExecuteGin is the first-execution path (a new key every iteration)
// through gin and the adapter.
func BenchmarkExecuteGin(b *testing.B) { decisiontest.BenchExecute(b, benchGin(b)) }
