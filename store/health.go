package store

import (
	"context"
	"errors"
)

// ErrDegraded is returned (wrapped) by a Pinger whose store still decides every
// claim but runs with a part down: a tiered store whose cache fails answers from
// its backstop alone. A readiness probe reports it as "degraded" and stays ready;
// any other Ping error means the store cannot answer (not ready).
var ErrDegraded = errors.New("idemkey/store: degraded")

// Pinger is implemented by stores that can check their servers, for readiness
// probes: Ping returns nil when the store can serve claims, an error wrapping
// ErrDegraded when it serves them with a part down, and any other error (the
// driver's, wrapped) when it cannot serve them. Ping honours ctx's deadline and
// changes no record. store/memory, store/postgres, store/redis and store/tiered
// implement it.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Ping pings s if it implements Pinger; a store without the method is taken to be
// always reachable (an in-process store) and answers nil.
func Ping(ctx context.Context, s Store) error {
	if p, ok := s.(Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}
