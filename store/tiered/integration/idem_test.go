package tiered_test

import (
	"testing"

	"github.com/idemkey/idemkey/idem/idemtest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/tiered"
)

// TestIdem runs package idem's suite (plain functions at most once) on the
// tiered store: shared Redis in front of shared Postgres.
func TestIdem(t *testing.T) {
	c := redistest.Shared(t)
	pool := pgPool(t)
	idemtest.Run(t, func(t *testing.T) store.Store {
		fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
		return mustTiered(t, fast, postgresBackstop(t, pool), tiered.WithTimeout(testTimeout))
	})
}
