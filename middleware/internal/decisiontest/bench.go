package decisiontest

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// The adapters' benchmarks all serve POST /pay with BenchBody and answer 201
// BenchAnswer, so their figures compare with the core's (NetHTTPBaseline) in one run.
var (
	BenchBody   = `{"amountCents":100}`
	BenchAnswer = []byte(`{"ok":true}`)
)

// NewBenchMiddleware is the middleware every adapter benchmark wraps: the memory
// store, one global scope, defaults otherwise.
func NewBenchMiddleware(b *testing.B) *middleware.Middleware {
	m, err := middleware.New(memory.New(), middleware.GlobalScope)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// NetHTTPBaseline is the core alone on a ServeMux, the baseline of an adapter's
// benchmarks.
func NetHTTPBaseline(b *testing.B) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /pay", NewBenchMiddleware(b).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.Write(BenchAnswer)
	})))
	return mux
}

func benchSend(h http.Handler, key string) int {
	r := httptest.NewRequest("POST", "/pay", strings.NewReader(BenchBody))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// BenchReplay measures the replay path through h: one stored response, the same
// key every iteration.
func BenchReplay(b *testing.B, h http.Handler) {
	benchSend(h, "bench")
	b.ReportAllocs()
	for b.Loop() {
		if code := benchSend(h, "bench"); code != http.StatusCreated {
			b.Fatal(code)
		}
	}
}

// BenchExecute measures the first-execution path through h: a new key every
// iteration.
func BenchExecute(b *testing.B, h http.Handler) {
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if code := benchSend(h, "k"+strconv.Itoa(i)); code != http.StatusCreated {
			b.Fatal(code)
		}
	}
}
