package claim_test

import (
	"context"
	"fmt"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// One claimed execution: claim, run under renewal, complete.
func Example() {
	cl, err := claim.New(claim.Config{Store: memory.New(), Lease: claim.DefaultLease, Retention: claim.DefaultRetention})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	id := store.ID{Scope: "jobs", Key: "job-42"}
	res, sent, err := cl.Claim(ctx, store.ClaimRequest{ID: id})
	if err != nil || res.Outcome != store.Claimed {
		fmt.Println("not claimed:", res.Outcome, err)
		return
	}
	var e claim.Execution
	e.Start(cl, ctx, id, res.Token, sent, nil) // renewed every third of the lease
	// ... the work runs here ...
	e.Stop()
	e.Returned()
	// One attempt; a store that fails to answer in time leaves the rest to the
	// background (pending), retried while the lease is held.
	if pending, err := e.Complete(store.Response{Status: 200, Body: []byte("done")}); err != nil && !pending {
		fmt.Println("complete:", err)
		return
	}
	again, _, _ := cl.Claim(ctx, store.ClaimRequest{ID: id})
	fmt.Println(again.Outcome, string(again.Record.Body))
	// Output: completed done
}
