package sharded_test

import (
	"fmt"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/sharded"
)

// Tenants routed by an application's own table, the rest by hash. In production
// the shards are one store per database (store/postgres on each tenant
// database's pool).
func Example() {
	eu, us := memory.New(), memory.New()
	home := map[string]store.Store{"acme": eu, "globex": us}
	byHash := sharded.ByHash(eu, us)
	s, err := sharded.New(func(scope string) store.Store {
		if sh, ok := home[scope]; ok {
			return sh
		}
		return byHash(scope)
	}, eu, us)
	if err != nil {
		panic(err) // a nil route or shard
	}
	acme, _ := s.Shard("acme")
	fmt.Println(acme == eu, sharded.Bucket("initech", 2))
	// Output: true 0
}
