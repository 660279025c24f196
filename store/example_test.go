package store_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// The life of a key through the contract, on the in-memory backend: a claim,
// a refused duplicate, completion, a replay, and a stale token refused.
func Example() {
	var s store.Store = memory.New()
	ctx := context.Background()
	req := store.ClaimRequest{
		ID:        store.ID{Scope: "tenant-1", Key: "order-42"},
		Lease:     10 * time.Second,
		Retention: 24 * time.Hour,
	}

	first, _ := s.Claim(ctx, req)
	dup, _ := s.Claim(ctx, req)
	fmt.Println(first.Outcome, dup.Outcome, dup.RetryAfter > 0)

	_ = s.Complete(ctx, req.ID, first.Token, store.Response{Status: 201, Body: []byte("ok")}, req.Retention)
	replay, _ := s.Claim(ctx, req)
	fmt.Println(replay.Outcome, replay.Record.Status, string(replay.Record.Body))

	other := req
	other.Fingerprint[0] = 1 // the same key for another request
	mismatch, _ := s.Claim(ctx, other)
	fmt.Println(mismatch.Outcome)

	err := s.Release(ctx, req.ID, first.Token) // completed: nothing to release
	fmt.Println(errors.Is(err, store.ErrLeaseLost))
	// Output:
	// claimed in_flight true
	// completed 201 ok
	// mismatch
	// true
}
