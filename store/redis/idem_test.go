package redis_test

import (
	"testing"

	"github.com/idemkey/idemkey/idem/idemtest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// TestIdem runs package idem's suite (plain functions at most once) on Redis.
func TestIdem(t *testing.T) {
	c := redistest.Shared(t)
	idemtest.Run(t, func(t *testing.T) store.Store {
		return redis.NewForTest(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
	})
}
