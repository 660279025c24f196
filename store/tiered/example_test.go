package tiered_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/tiered"
)

// An in-process cache in front of an authoritative store: the memory store
// keeps a copy of every record completed through this process (within its
// bound), so a replay of a hot key costs no round trip to the authority. Here
// the authority is another memory store, so the example runs without servers;
// in production it is *postgres.Store (tiered.New(memory.New(), pg)).
func Example_memoryCache() {
	ctx := context.Background()
	authority := memory.New()
	s, err := tiered.New(memory.New(memory.WithMaxBytes(32<<20)), authority)
	if err != nil {
		log.Fatal(err)
	}
	req := store.ClaimRequest{ID: store.ID{Scope: "tenant-1", Key: "order-42"}, Lease: 10 * time.Second, Retention: 24 * time.Hour}

	first, _ := s.Claim(ctx, req) // the authority decides: run the handler
	fmt.Println(first.Outcome)
	_ = s.Complete(ctx, req.ID, first.Token, store.Response{Status: 201, Body: []byte(`{"id":42}`)}, req.Retention)

	for range 3 {
		retry, _ := s.Claim(ctx, req) // answered by the cache alone
		fmt.Println(retry.Outcome, retry.Record.Status, string(retry.Record.Body))
	}
	fmt.Println("answered by the cache:", s.Stats().FastAnswers)
	// Output:
	// claimed
	// completed 201 {"id":42}
	// completed 201 {"id":42}
	// completed 201 {"id":42}
	// answered by the cache: 3
}
