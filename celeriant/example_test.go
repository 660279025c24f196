package celeriant_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
)

// Example writes an event idempotently through the TCP client to a simulator, shows the
// answer to a replay of the same ClientSeq, and reads the stream back.
func Example() {
	sim := celeriantsim.New(celeriantsim.Options{})
	ln, err := sim.ListenAndServe("127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer sim.Close()

	ctx := context.Background()
	c, err := celeriant.Dial(ctx, ln.Addr().String())
	if err != nil {
		panic(err)
	}
	defer c.Close()

	account := celeriant.AggregateKey{Org: uuid.MustParse("11111111-1111-1111-1111-111111111111"),
		Type: uuid.MustParse("22222222-2222-2222-2222-222222222222"), ID: uuid.MustParse("33333333-3333-3333-3333-333333333333")}
	service := uuid.MustParse("44444444-4444-4444-4444-444444444444")
	deposit := celeriant.WriteRequest{ClientID: service, Writes: []celeriant.AggregateWrite{{
		Key: account,
		Events: []celeriant.Event{{ClientSeq: 1, EventID: uuid.NewSHA1(uuid.NameSpaceURL, []byte("idempotency-key-1")),
			TypeMajor: 1, Value: []byte(`{"amount":100}`)}},
		AllowCreate: true, ExpectedVersion: celeriant.Version(0), EnforceClientIdempotency: true,
	}}}
	res, err := c.Write(ctx, deposit)
	fmt.Println("version", res.Version, err)

	// The same ClientSeq again, with the fresh expected version: 2002, already landed.
	deposit.Writes[0].ExpectedVersion = celeriant.Version(1)
	_, err = c.Write(ctx, deposit)
	var se *celeriant.ServerError
	fmt.Println(errors.Is(err, celeriant.ErrIdempotencyViolation), errors.As(err, &se) && se.LastClientSeq == 1)

	page, err := c.Read(ctx, celeriant.ReadRequest{Key: account, Filters: celeriant.ReadFilters{FromVersion: 1}})
	if err != nil {
		panic(err)
	}
	for _, b := range page.Batches {
		fmt.Printf("v%d seq %d %s\n", b.Version, b.Events[0].ClientSeq, b.Events[0].Value)
	}
	// Output:
	// version 1 <nil>
	// true true
	// v1 seq 1 {"amount":100}
}
