package fasthttpbridge

import (
	"context"
	"net"
	"net/http"
	"testing"

	"github.com/valyala/fasthttp"
)

// newCtx is a request as the end-to-end harness (benchmarks/endtoend) sends
// it, parsed by fasthttp.
func newCtx(tb testing.TB) *fasthttp.RequestCtx {
	raw := "POST /api/transfers HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: Go-http-client/1.1\r\n" +
		"Content-Length: 16\r\nContent-Type: application/json\r\nIdempotency-Key: 0a1b2c3d-0001-4000-8000-000000000001\r\n" +
		"X-Client-Id: tenant-1\r\nAccept-Encoding: gzip\r\n\r\n{\"amount\":12345}"
	var req fasthttp.Request
	if err := req.ReadLimitBody(bufioReader(raw), 0); err != nil {
		tb.Fatal(err)
	}
	fc := new(fasthttp.RequestCtx)
	fc.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
	return fc
}

// BenchmarkRequest is the net/http view of a request, and the answer of a
// replay written through the writer: the bridge's whole cost on a replay.
func BenchmarkRequest(b *testing.B) {
	fc := newCtx(b)
	ctx := context.Background()
	answer := []byte(`{"balanceCents":98766,"aggregateVersion":42}`)
	b.ReportAllocs()
	for b.Loop() {
		r, err := Request(ctx, fc)
		if err != nil || r.Header.Get("Idempotency-Key") == "" {
			b.Fatal(err)
		}
		w := NewWriter(&fc.Response)
		w.Header()["Content-Type"] = []string{"application/json"}
		w.Header()["Idempotent-Replayed"] = []string{"true"}
		w.WriteHeader(http.StatusCreated)
		w.Write(answer)
		Release(w)
		fc.Response.Reset()
	}
}
