package store_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// An operator looks at one key and evicts it: a live claim is refused under the
// default policy, a completed record is removed, and the key is new again.
func ExampleInspector() {
	var s store.Store = memory.New()
	ctx := context.Background()
	req := store.ClaimRequest{ID: store.ID{Scope: "tenant-1", Key: "order-42"}, Lease: 10 * time.Second, Retention: time.Hour}
	claim, _ := s.Claim(ctx, req)

	in, ok := s.(store.Inspector) // optional: not every store implements it
	if !ok {
		return
	}
	info, _ := in.Inspect(ctx, req.ID)
	fmt.Println(info.State, info.LeaseLive())
	_, evicted, _ := in.Evict(ctx, req.ID, store.EvictSettled)
	fmt.Println("evicted while in flight:", evicted)

	_ = s.Complete(ctx, req.ID, claim.Token, store.Response{Status: 201, Body: []byte("ok")}, req.Retention)
	found, evicted, _ := in.Evict(ctx, req.ID, store.EvictSettled)
	fmt.Println(found.State, found.Status, "evicted:", evicted)

	again, _ := s.Claim(ctx, req)
	fmt.Println(again.Outcome)
	// Output:
	// in_flight true
	// evicted while in flight: false
	// completed 201 evicted: true
	// claimed
}
