package celeriant_test

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
)

// Watch one aggregate through the client, against the simulator over TCP: the
// notifications of what commits after the acknowledgement.
func ExampleClient_Watch() {
	ctx := context.Background()
	sim := celeriantsim.New(celeriantsim.Options{})
	defer sim.Close()
	ln, _ := sim.ListenAndServe("127.0.0.1:0")
	c, _ := celeriant.New(celeriant.Config{Addrs: []string{ln.Addr().String()}})
	defer c.Close()

	key := celeriant.AggregateKey{Org: uuid.New(), Type: uuid.New(), ID: uuid.New()}
	s, err := c.Watch(ctx, celeriant.WatchRequest{Aggregates: []uuid.UUID{key.ID}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	for seq := uint64(1); seq <= 2; seq++ {
		_, _ = c.Write(ctx, celeriant.WriteRequest{ClientID: uuid.New(), Writes: []celeriant.AggregateWrite{{
			Key: key, Events: []celeriant.Event{{ClientSeq: seq, TypeMajor: 1, Value: []byte("{}")}}, AllowCreate: true,
		}}})
	}
	for range 3 { // Create, then a Write per version
		res, err := s.Next(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, ev := range res.Events {
			fmt.Println(ev.Operation, ev.FromVersion, ev.ToVersion)
		}
	}
	// Output:
	// Create 0 0
	// Write 1 1
	// Write 2 2
}
