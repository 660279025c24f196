package writeloop_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/writeloop"
)

// appendNote is a Celeriant-backed handler's write: one event on one aggregate, its
// ClientSeq derived from the stream, made idempotent by its EventId.
type appendNote struct {
	store    celeriant.EventStore
	key      celeriant.AggregateKey
	clientID uuid.UUID
	eventID  uuid.UUID
	text     string

	version, seq uint64 // this attempt's expected version and ClientSeq
}

func (a *appendNote) Prepare(ctx context.Context, attempt int, reDerive bool) (bool, error) {
	batches, err := celeriant.ReadAll(ctx, a.store, celeriant.ReadRequest{Key: a.key})
	if err != nil && !celeriant.IsNotFound(err) {
		return false, err
	}
	a.version = 0
	for _, b := range batches {
		a.version = b.Version
		for _, ev := range b.Events {
			if ev.EventID == a.eventID {
				return true, nil // landed earlier: a retry answers without writing
			}
		}
	}
	if reDerive {
		a.seq = writeloop.MaxClientSeq(0, batches, a.clientID) + 1
	}
	return false, nil
}

func (a *appendNote) Write(ctx context.Context) error {
	_, err := a.store.Write(ctx, celeriant.WriteRequest{ClientID: a.clientID, Writes: []celeriant.AggregateWrite{{
		Key:         a.key,
		Events:      []celeriant.Event{{ClientSeq: a.seq, EventID: a.eventID, TypeMajor: 1, Value: []byte(a.text)}},
		AllowCreate: true, ExpectedVersion: celeriant.Version(a.version), EnforceClientIdempotency: true,
	}}})
	return err
}

func (a *appendNote) Owner(ctx context.Context) (writeloop.Verdict, error) {
	return writeloop.WhoOwnsSeq(ctx, a.store, a.key, a.clientID, a.seq, a.eventID)
}

// Example appends a note under an idempotency key, with a forced 2003 on the first
// attempt, then retries the same request: the retry finds the event and writes nothing.
func Example() {
	sim := celeriantsim.New(celeriantsim.Options{})
	defer sim.Close()
	ctx := context.Background()
	ns := uuid.MustParse("5b1f0c4e-8c7a-4f61-9d2e-3a4b5c6d7e8f") // the handler's EventId namespace
	note := func() *appendNote {
		return &appendNote{
			store:    sim,
			key:      celeriant.AggregateKey{Org: uuid.MustParse("11111111-1111-1111-1111-111111111111"), Type: uuid.MustParse("22222222-2222-2222-2222-222222222222"), ID: uuid.MustParse("33333333-3333-3333-3333-333333333333")},
			clientID: uuid.MustParse("44444444-4444-4444-4444-444444444444"),
			eventID:  writeloop.EventID(ns, "tenant-1", "key-1", "POST /notes hello"),
			text:     "hello",
		}
	}
	loop := writeloop.Loop{Backoff: writeloop.Backoff{Sleep: func(context.Context, time.Duration) error { return nil }}}

	sim.ForceConflict()
	out, err := loop.Run(ctx, note())
	fmt.Println(out, err)
	out, err = loop.Run(ctx, note())
	fmt.Println(out, err)
	d, _ := sim.AggregateDetails(ctx, note().key)
	fmt.Println("version", d.MaxVersion)
	// Output:
	// Written <nil>
	// Found <nil>
	// version 1
}
