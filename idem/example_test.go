package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkey/idemkey/idem"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// A charge runs once per business key: the repeat gets the stored result, and
// the same key with other arguments is refused.
func Example() {
	st := memory.New()
	ctx := context.Background()
	id := store.ID{Scope: "billing-jobs", Key: "invoice-2026-0042"}
	args := []byte(`{"amountCents":1200}`)

	charges := 0
	charge := func(context.Context) ([]byte, error) {
		charges++
		return []byte(`{"chargeId":"ch_1"}`), nil
	}

	first, _ := idem.Do(ctx, st, id, idem.Fingerprint(args), charge)
	again, _ := idem.Do(ctx, st, id, idem.Fingerprint(args), charge)
	fmt.Println(string(first.Value), first.Replayed)
	fmt.Println(string(again.Value), again.Replayed)

	_, err := idem.Do(ctx, st, id, idem.Fingerprint([]byte(`{"amountCents":9900}`)), charge)
	fmt.Println(errors.Is(err, idem.ErrMismatch), "charges:", charges)
	// Output:
	// {"chargeId":"ch_1"} false
	// {"chargeId":"ch_1"} true
	// true charges: 1
}
