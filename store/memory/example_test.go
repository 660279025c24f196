package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

func Example() {
	s := memory.New()
	ctx := context.Background()
	req := store.ClaimRequest{
		ID:        store.ID{Scope: "tenant-1", Key: "order-42"},
		Lease:     10 * time.Second,
		Retention: 24 * time.Hour,
	}

	first, _ := s.Claim(ctx, req)
	fmt.Println(first.Outcome) // run the handler, then store its answer
	_ = s.Complete(ctx, req.ID, first.Token, store.Response{Status: 201, Body: []byte(`{"id":42}`)}, req.Retention)

	retry, _ := s.Claim(ctx, req)
	fmt.Println(retry.Outcome, retry.Record.Status, string(retry.Record.Body))
	// Output:
	// claimed
	// completed 201 {"id":42}
}
