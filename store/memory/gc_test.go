package memory

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// BenchmarkMarkRecords measures what the garbage collector spends on a store of
// 200,000 completed records (a small JSON answer with its Content-Type): ns/op
// is one full collection (runtime.GC), most of it marking. The records live in
// blocks and the map, queue and heap hold no pointers (arena.go), so marking
// visits a block per 46 records and each record's response copy, not an object
// and three pointers per record.
func BenchmarkMarkRecords(b *testing.B) {
	s := New(WithMaxBytes(0))
	ctx := context.Background()
	resp := store.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"balanceCents":98766,"aggregateVersion":42}`)}
	for i := range 200_000 {
		id := store.ID{Scope: "tenant-1", Key: fmt.Sprintf("%036d", i)}
		res, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: store.Fingerprint{1}, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, id, res.Token, resp, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	for b.Loop() {
		runtime.GC()
	}
	runtime.KeepAlive(s)
}
