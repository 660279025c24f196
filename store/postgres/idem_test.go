package postgres

import (
	"testing"

	"github.com/idemkey/idemkey/idem/idemtest"
	"github.com/idemkey/idemkey/store"
)

// TestIdem runs package idem's suite (plain functions at most once) on Postgres.
func TestIdem(t *testing.T) {
	pool := newPool(t, "")
	idemtest.Run(t, func(t *testing.T) store.Store { return newStore(t, pool, nil) })
}
