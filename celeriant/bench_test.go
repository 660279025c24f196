package celeriant_test

import (
	"context"
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

// BenchmarkClientWriteTCP: one Write round trip through the client to the simulator
// over loopback TCP (one frame out, one frame back).
func BenchmarkClientWriteTCP(b *testing.B) {
	_, addr := startSim(b, celeriantsim.Options{})
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
}
