package sharded

import (
	"hash/fnv"

	"github.com/idemkey/idemkey/store"
)

// ByHash returns the route of the simple case: the scope's 64-bit FNV-1a hash
// mapped onto shards with jump consistent hashing (Lamport and Veach, "A Fast,
// Minimal Memory, Consistent Hash Algorithm", 2014), so a scope always reaches
// the same store of the list, and appending a store to the list moves only about
// 1/(n+1) of the scopes, all of them to the new store (see the package doc on
// moving scopes). The list is copied; with an empty list the route gives no
// store (ErrNoShard), and New refuses such a store list anyway.
func ByHash(shards ...store.Store) func(scope string) store.Store {
	list := append([]store.Store(nil), shards...)
	return func(scope string) store.Store {
		if len(list) == 0 {
			return nil
		}
		return list[Bucket(scope, len(list))]
	}
}

// NewHashed is New with the ByHash route over shards.
func NewHashed(shards ...store.Store) (*Store, error) { return New(ByHash(shards...), shards...) }

// Bucket is the shard index ByHash gives scope among n shards: in [0, n), the
// same on every platform and release (the hash and the jump are fixed). n must
// be positive; Bucket returns 0 otherwise.
func Bucket(scope string, n int) int {
	if n <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(scope))
	key := h.Sum64()
	var b, j int64 = -1, 0
	for j < int64(n) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return int(b)
}
