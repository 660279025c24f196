package tiered

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkey/idemkey/store"
)

var _ store.Inspector = (*Store)(nil)

// inspectors returns the backstop's and the cache's store.Inspector (cache nil
// when there is no fast store), or an error wrapping errors.ErrUnsupported when
// one of them does not implement it.
func (s *Store) inspectors(op string, needCache bool) (back, cache store.Inspector, err error) {
	back, ok := s.backstop.(store.Inspector)
	if !ok {
		return nil, nil, fmt.Errorf("idemkey/store/tiered: %s: backstop %T is not a store.Inspector: %w", op, s.backstop, errors.ErrUnsupported)
	}
	if needCache && s.fast != nil {
		if cache, ok = s.fast.(store.Inspector); !ok {
			return nil, nil, fmt.Errorf("idemkey/store/tiered: %s: cache %T is not a store.Inspector: %w", op, s.fast, errors.ErrUnsupported)
		}
	}
	return back, cache, nil
}

// Inspect implements store.Inspector: the backstop's record, since the backstop
// decides every claim; the cache is not asked. Errors: store.ErrInvalid, an error
// wrapping errors.ErrUnsupported when the backstop is not a store.Inspector, or
// the backstop's error, wrapped.
func (s *Store) Inspect(ctx context.Context, id store.ID) (store.Info, error) {
	if err := store.ValidateInspect(id); err != nil {
		return store.Info{}, err
	}
	back, _, err := s.inspectors("inspect", false)
	if err != nil {
		return store.Info{}, err
	}
	info, err := back.Inspect(ctx, id)
	if err != nil {
		return store.Info{}, fmt.Errorf("idemkey/store/tiered: backstop inspect: %w", err)
	}
	return info, nil
}

// Evict implements store.Inspector: the backstop judges and removes its record;
// then, when it removed it or had none, the cache's copy of id (a completed
// record or a marker) is dropped whatever it is (the cache's Evict with
// store.EvictAny, bounded by WithTimeout, attempted even while cooling down), so
// the cache cannot replay what the backstop no longer holds. A refused eviction
// leaves the cache alone. Both the backstop and the cache must implement
// store.Inspector (*postgres.Store, *memory.Store and *redis.Store do); otherwise
// Evict fails with an error wrapping errors.ErrUnsupported before any I/O.
//
// When the cache's copy cannot be dropped, Evict returns the backstop's answer
// (evicted true) with the cache's error, wrapped: the cache may replay the record
// until its TTL ends; evicting again once the cache is back drops it. A replay
// racing the eviction can also copy the record back into the cache just after it
// was dropped (a backfill read before the eviction): Inspect cannot see the
// cache, so evict again if replays continue.
func (s *Store) Evict(ctx context.Context, id store.ID, policy store.EvictPolicy) (store.Info, bool, error) {
	if err := store.ValidateEvict(id, policy); err != nil {
		return store.Info{}, false, err
	}
	back, cache, err := s.inspectors("evict", true)
	if err != nil {
		return store.Info{}, false, err
	}
	found, evicted, err := back.Evict(ctx, id, policy)
	if err != nil {
		return store.Info{}, false, fmt.Errorf("idemkey/store/tiered: backstop evict: %w", err)
	}
	if cache == nil || !evicted && found.State != store.StateAbsent {
		return found, evicted, nil
	}
	_, err = s.fastCall(ctx, OpEvict, func(ctx context.Context) error {
		_, _, err := cache.Evict(ctx, id, store.EvictAny)
		return err
	})
	if err != nil {
		return found, evicted, fmt.Errorf("idemkey/store/tiered: evict: the cache's copy was not dropped: %w", err)
	}
	return found, evicted, nil
}
