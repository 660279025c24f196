package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkConsume drains b.N distinct instructions, published beforehand,
// through the consumer in this process: with the inbox, and with the same
// handler (the instruction's insert in its own transaction) without it. It
// reports messages per second from the ready line to the last row.
//
//	go test -run '^$' -bench Consume -benchtime 2000x ./examples/consumer
func BenchmarkConsume(b *testing.B) {
	for _, br := range brokers {
		for _, mode := range []string{"inbox", "without-inbox"} {
			b.Run(br.name+"/"+mode, func(b *testing.B) {
				broker, tb := br.open(b), newTables(b)
				ins, msgs := instructions(b.N)
				for i := range ins { // one publish per instruction: no duplicates to tell the two apart
					msgs[i] = message{instruction: ins[i], brokerID: fmt.Sprint("bench-", i, "-", uniqueName())}
				}
				broker.publish(b, msgs[:b.N])
				cfg, err := loadConfig(lookup(append(broker.env(), tb.env()...)))
				if err != nil {
					b.Fatal(err)
				}
				cfg.withoutInbox = mode == "without-inbox"
				ctx, cancel := context.WithCancel(context.Background())
				ready := &readyWriter{ch: make(chan struct{})}
				var wg sync.WaitGroup
				wg.Go(func() {
					if err := consume(ctx, cfg, ready, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
						b.Error(err)
					}
				})
				<-ready.ch
				b.ResetTimer()
				start := time.Now()
				waitUntil(b, 5*time.Minute, "every instruction applied", func() bool { return tb.rows(b) >= b.N })
				elapsed := time.Since(start)
				b.StopTimer()
				cancel()
				wg.Wait()
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			})
		}
	}
}

// lookup is a getenv over "KEY=value" entries, falling back to the process's.
func lookup(env []string) func(string) string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return func(k string) string {
		if v, ok := m[k]; ok {
			return v
		}
		return os.Getenv(k)
	}
}

// readyWriter closes ch at the first write (the "consuming" line).
type readyWriter struct {
	once sync.Once
	ch   chan struct{}
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.ch) })
	return len(p), nil
}
