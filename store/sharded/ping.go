package sharded

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkey/idemkey/store"
)

// Ping implements store.Pinger: it pings every shard at once (store.Ping: a shard
// without the method counts as up) and waits for all. nil when all are up; an
// error wrapping store.ErrDegraded when at least one is up and some are down or
// degraded (the tenants of the others are still served, so a readiness probe
// keeps the process in rotation, and the error names the shards down); the
// shards' errors, joined, when none is up. A ctx cancelled by the caller is
// returned as such.
func (s *Store) Ping(ctx context.Context) error {
	errs := make([]error, len(s.shards))
	done := make(chan struct{}, len(s.shards))
	for i, sh := range s.shards {
		go func() {
			errs[i] = store.Ping(ctx, sh)
			done <- struct{}{}
		}()
	}
	for range s.shards {
		<-done
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var down, degraded []int
	var failures []error
	for i, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, store.ErrDegraded):
			degraded = append(degraded, i)
		default:
			down = append(down, i)
			failures = append(failures, fmt.Errorf("shard %d: %w", i, err))
		}
	}
	switch {
	case len(down) == 0 && len(degraded) == 0:
		return nil
	case len(down) == len(s.shards):
		return fmt.Errorf("idemkey/store/sharded: every shard is down: %w", errors.Join(failures...))
	}
	return fmt.Errorf("idemkey/store/sharded: %w: shards down %v, degraded %v: %w", store.ErrDegraded, down, degraded, errors.Join(failures...))
}
