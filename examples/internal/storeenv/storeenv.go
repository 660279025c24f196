// Package storeenv opens the idempotency store the examples' environment names
// (docs/architecture.md section 6): IDEM_STORE = memory (default), postgres, redis or tiered,
// with DATABASE_URL and REDIS_URL.
package storeenv

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// ErrConfig reports an environment the examples cannot run with.
var ErrConfig = errors.New("storeenv: bad configuration")

// Store is an opened store with the function that releases its connections.
type Store struct {
	store.Store
	// Name is the IDEM_STORE value in effect ("memory", "postgres", ...).
	Name string
	// Ping checks that the store's servers answer (for /readyz); nil for memory.
	Ping func(ctx context.Context) error
	// Close releases connections and background workers.
	Close func()
}

// Open opens the store named by getenv("IDEM_STORE").
func Open(ctx context.Context, getenv func(string) string) (*Store, error) {
	name := strings.ToLower(strings.TrimSpace(getenv("IDEM_STORE")))
	if name == "" {
		name = "memory"
	}
	switch name {
	case "memory":
		return &Store{Store: memory.New(), Name: name, Close: func() {}}, nil
	default:
		return open(ctx, name, getenv)
	}
}

func need(getenv func(string) string, name, forStore string) (string, error) {
	v := getenv(name)
	if v == "" {
		return "", fmt.Errorf("%w: IDEM_STORE=%s needs %s", ErrConfig, forStore, name)
	}
	return v, nil
}
