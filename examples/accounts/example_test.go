package accounts_test

import (
	"context"
	"fmt"

	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/accounts"
)

// A deposit retried with the same idempotency key is answered from the dedup index: one
// event in the log, the original answer twice, on any replica.
func Example() {
	ctx := context.Background()
	log := celeriantsim.New(celeriantsim.Options{}) // or celeriant.Dial(...) for a real server
	replicaA, _ := accounts.New(log, accounts.NewMemoryProjection())
	replicaB, _ := accounts.New(log, accounts.NewMemoryProjection())
	if err := replicaA.Seed(ctx); err != nil {
		fmt.Println("seed:", err)
		return
	}

	// Scope, Idempotency-Key and the operation the request asks for.
	eventID := accounts.EventIDFor("tenant-1", "order-42", accounts.Operation("deposit", 2_500, accounts.AliceID))
	first, _ := replicaA.Deposit(ctx, accounts.AliceID, 2_500, eventID)
	retry, _ := replicaB.Deposit(ctx, accounts.AliceID, 2_500, eventID)
	fmt.Printf("first: %d cents at v%d\n", first.BalanceCents, first.AggregateVersion)
	fmt.Printf("retry: %d cents at v%d\n", retry.BalanceCents, retry.AggregateVersion)

	_, err := replicaB.Withdraw(ctx, accounts.AliceID, 1_000_000, accounts.NewEventID())
	fmt.Println(err)
	// Output:
	// first: 52500 cents at v2
	// retry: 52500 cents at v2
	// accounts: cannot process $10000.00, balance is $525.00
}
