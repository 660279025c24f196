package idemprom_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/middleware"
	idemprom "github.com/idemkey/idemkey/observer/prometheus"
	"github.com/idemkey/idemkey/store/memory"
)

// BenchmarkObserve is the observer's own cost per request event.
func BenchmarkObserve(b *testing.B) {
	obs, err := idemprom.NewObserver(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	e := middleware.Event{Decision: middleware.Executed, Status: 201, StoreLatency: 300 * time.Microsecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			obs.Observe(ctx, e)
		}
	})
}

type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) WriteHeader(int)             {}
func (w *nopWriter) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkMiddleware compares the middleware on the memory store, first
// executions, without and with the Observer: the ratio of the two is the
// observer's share of a request.
func BenchmarkMiddleware(b *testing.B) {
	for _, withObserver := range []bool{false, true} {
		name := "none"
		if withObserver {
			name = "observer"
		}
		b.Run(name, func(b *testing.B) {
			opts := []middleware.Option{middleware.WithLogger(slog.New(slog.DiscardHandler))}
			if withObserver {
				obs, err := idemprom.NewObserver(prometheus.NewRegistry())
				if err != nil {
					b.Fatal(err)
				}
				opts = append(opts, middleware.WithObserver(obs))
			}
			// Every key is kept: a bound far above what a run adds (the default would
			// fill and answer 503 in a long run).
			m, err := middleware.New(memory.New(memory.WithMaxBytes(1<<40)), middleware.GlobalScope, opts...)
			if err != nil {
				b.Fatal(err)
			}
			h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"ok":true}`))
			}))
			r, _ := http.NewRequest("POST", "http://svc/payments", nil)
			r.Header.Set("Idempotency-Key", "k")
			w := &nopWriter{h: http.Header{}}
			body := strings.NewReader("")
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				body.Reset(`{"amountCents":100}`)
				r.Body = io.NopCloser(body)
				r.Header["Idempotency-Key"][0] = strconv.Itoa(i)
				clear(w.h)
				h.ServeHTTP(w, r)
			}
		})
	}
}
