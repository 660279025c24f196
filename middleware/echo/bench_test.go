package idemecho_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemkey/idemkey/middleware"
	idemecho "github.com/idemkey/idemkey/middleware/echo"
	"github.com/idemkey/idemkey/store/memory"
)

// benchReplay measures the replay path (one stored response, same key every
// iteration) through h.
func benchReplay(b *testing.B, h http.Handler) {
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/pay", strings.NewReader(`{"amountCents":100}`))
		r.Header.Set("Idempotency-Key", "bench")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	send()
	b.ReportAllocs()
	for b.Loop() {
		if w := send(); w.Code != 201 {
			b.Fatal(w.Code)
		}
	}
}

func newBenchMiddleware(b *testing.B) *middleware.Middleware {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// BenchmarkReplayNetHTTP is the core alone, the baseline of BenchmarkReplayEcho.
func BenchmarkReplayNetHTTP(b *testing.B) {
	mux := http.NewServeMux()
	mux.Handle("POST /pay", newBenchMiddleware(b).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		w.Write([]byte(`{"ok":true}`))
	})))
	benchReplay(b, mux)
}

// BenchmarkReplayEcho is the same through echo and the adapter.
func BenchmarkReplayEcho(b *testing.B) {
	e := echo.New()
	e.POST("/pay", func(c echo.Context) error { return c.Blob(201, "application/json", []byte(`{"ok":true}`)) },
		idemecho.Middleware(newBenchMiddleware(b)))
	benchReplay(b, e)
}

// BenchmarkExecuteEcho measures the first-execution path (a new key every
// iteration) through echo and the adapter.
func BenchmarkExecuteEcho(b *testing.B) {
	e := echo.New()
	e.POST("/pay", func(c echo.Context) error { return c.Blob(201, "application/json", []byte(`{"ok":true}`)) },
		idemecho.Middleware(newBenchMiddleware(b)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		r := httptest.NewRequest("POST", "/pay", strings.NewReader(`{"amountCents":100}`))
		r.Header.Set("Idempotency-Key", "k"+itoa(i))
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		if w.Code != 201 {
			b.Fatal(w.Code)
		}
	}
}

func itoa(i int) string {
	var buf [20]byte
	n := len(buf)
	for {
		n--
		buf[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			return string(buf[n:])
		}
	}
}

// BenchmarkExecuteNetHTTP is the core alone on the first-execution path, the
// baseline of the adapter's execute benchmark.
func BenchmarkExecuteNetHTTP(b *testing.B) {
	mux := http.NewServeMux()
	mux.Handle("POST /pay", newBenchMiddleware(b).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		w.Write([]byte(`{"ok":true}`))
	})))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		r := httptest.NewRequest("POST", "/pay", strings.NewReader(`{"amountCents":100}`))
		r.Header.Set("Idempotency-Key", "k"+itoa(i))
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		if w.Code != 201 {
			b.Fatal(w.Code)
		}
	}
}
