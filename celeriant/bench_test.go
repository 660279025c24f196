package celeriant_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// BenchmarkEncodeWrite: one Write frame with one small event (the golden vector's shape).
func BenchmarkEncodeWrite(b *testing.B) {
	enc := wire.NewEncoder()
	req := goldenWriteRequest()
	b.ReportAllocs()
	for b.Loop() {
		_ = enc.WriteRequest(&req)
	}
}

// BenchmarkDecodeReadResponse100: a ReadResponse of 100 batches of one small event.
func BenchmarkDecodeReadResponse100(b *testing.B) {
	res := celeriant.ReadResult{CorrelationID: idCorr}
	for i := range 100 {
		ev := goldenEvent
		ev.ClientSeq, ev.EventSeq = uint64(i+1), uint64(i+1)
		res.Batches = append(res.Batches, celeriant.Batch{Version: uint64(i + 1), ClientID: idClient, ServerTimestamp: 1700000000123, Events: []celeriant.Event{ev}})
	}
	body := wire.NewEncoder().ReadResponse(&res)[wire.HeaderSize:]
	dec := wire.NewDecoder()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := dec.ReadResponse(body); err != nil {
			b.Fatal(err)
		}
	}
}

// benchTargets returns the servers the round-trip benchmarks run against: the simulator
// over loopback TCP, and the real server at CELERIANT_ADDR when it is set.
func benchTargets(b *testing.B) map[string]string {
	_, addr := startSim(b, celeriantsim.Options{})
	out := map[string]string{"sim": addr}
	if live := os.Getenv("CELERIANT_ADDR"); live != "" {
		out["live"] = live
	}
	return out
}

// BenchmarkClientWriteTCP: one Write round trip through the client over loopback TCP
// (one frame out, one frame back), one at a time: against the simulator it measures the
// client and the codec; against a real server also the server's write path and its
// durable commit (a lone write is answered well within the server's fsync window;
// concurrent writes share one).
func BenchmarkClientWriteTCP(b *testing.B) {
	for name, addr := range benchTargets(b) {
		b.Run(name, func(b *testing.B) {
			c := newClient(b, celeriant.Config{Addrs: []string{addr}})
			ctx, key, client := context.Background(), freshKey(), uuid.New()
			seq := uint64(0)
			b.ReportAllocs()
			for b.Loop() {
				seq++
				if _, err := c.Write(ctx, simpleWrite(key, client, seq)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkClientWriteTCPParallel: Write round trips from many goroutines, each to an
// aggregate of its own, on the client's default 8 connections and on 64: the throughput
// a server reaches when concurrent writes share its fsyncs (ns/op is wall time per
// write of all goroutines together).
func BenchmarkClientWriteTCPParallel(b *testing.B) {
	for name, addr := range benchTargets(b) {
		for _, conns := range []int{8, 64} {
			b.Run(fmt.Sprintf("%s/conns=%d", name, conns), func(b *testing.B) {
				c := newClient(b, celeriant.Config{Addrs: []string{addr}, MaxConns: conns})
				ctx := context.Background()
				b.SetParallelism(max(conns/runtime.GOMAXPROCS(0), 1)) // about one goroutine per connection (exactly when GOMAXPROCS divides conns)
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					key, client := freshKey(), uuid.New()
					seq := uint64(0)
					for pb.Next() {
						seq++
						if _, err := c.Write(ctx, simpleWrite(key, client, seq)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
