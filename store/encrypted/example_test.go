package encrypted_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/encrypted"
	"github.com/idemkey/idemkey/store/memory"
)

// A record sealed with last month's key still replays after the rotation;
// new records are sealed with the new key. In production the secrets come
// from a secret manager, 32 random bytes each.
func Example() {
	ctx := context.Background()
	secret := func() []byte { b := make([]byte, encrypted.KeySize); rand.Read(b); return b }
	nov, dec := encrypted.Key{ID: "2026-11", Secret: secret()}, encrypted.Key{ID: "2026-12", Secret: secret()}
	backend := memory.New() // or store/postgres, store/redis, store/tiered...

	before, err := encrypted.New(backend, nov)
	if err != nil {
		panic(err)
	}
	id := store.ID{Scope: "merchant-7", Key: "order-1"}
	req := store.ClaimRequest{ID: id, Lease: time.Minute, Retention: 24 * time.Hour}
	res, _ := before.Claim(ctx, req)
	_ = before.Complete(ctx, id, res.Token, store.Response{Status: 201, Body: []byte(`{"card":"tok_4242"}`)}, 24*time.Hour)

	after, err := encrypted.New(backend, dec, nov) // current key first, then the old ones
	if err != nil {
		panic(err)
	}
	res, err = after.Claim(ctx, req)
	fmt.Println(res.Outcome, string(res.Record.Body), err)

	raw, _ := backend.Claim(ctx, req) // what the backend holds
	fmt.Println(raw.Record.Status, len(raw.Record.Body), string(raw.Record.Body) == `{"card":"tok_4242"}`)
	// Output:
	// completed {"card":"tok_4242"} <nil>
	// 201 19 false
}
