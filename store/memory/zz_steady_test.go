package memory_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

func BenchmarkSteadyXX(b *testing.B) {
	const liveKeys = 4096
	c := newFakeClock()
	s := memory.New(memory.WithClock(c.Now))
	keys := make([]string, 2*liveKeys)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	ctx := context.Background()
	resp := store.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"balanceCents":98766,"aggregateVersion":42}`)}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.Advance(24 * time.Hour / liveKeys)
		id := store.ID{Scope: "tenant-1", Key: keys[i%len(keys)]}
		i++
		res, _ := s.Claim(ctx, store.ClaimRequest{ID: id, Lease: 10 * time.Second, Retention: 24 * time.Hour})
		s.Complete(ctx, id, res.Token, resp, 24*time.Hour)
	}
}
