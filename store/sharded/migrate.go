package sharded

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkey/idemkey/store"
)

// NewMigration returns a store that moves scopes from the placement prev to
// the placement next without re-running any completed key and without two
// holders for one claim: for a scope whose two placements differ, a key with a
// record (completed, or in flight) on its previous shard is judged there
// (replayed, 409, 422, or taken over when its lease expired), and only a key
// the previous shard does not hold is claimed on the next one. shards lists
// every store either route can return; each must be a store.Inspector (every
// store of this module is), since the previous shard is asked first.
//
// Cost: for a moved scope, one Inspect on the previous shard before each
// claim, and a Complete, Release or Renew tries the next shard first and the
// previous one when the next does not hold the token (store.ErrLeaseLost); a
// scope that does not move costs nothing more. Run it for one retention period
// (the longest a record lives), then switch to New(next, ...): every record of
// the previous placement has expired by then.
//
// Rollout: while the change rolls out, an instance still on New(prev, ...)
// claims new keys on the previous shard and an upgraded one on the next, so
// one new key sent at the same moment to an instance of each kind could run
// twice; a retry sent after the first attempt was claimed is judged on the
// previous shard. Where two concurrent first attempts matter, roll out while
// the moved scopes' writes are paused.
//
// Shard answers the next placement. A handler completing its record in its own
// transaction (store/postgres CompleteTx) on a moved scope writes to the next
// shard, so its claim must be there: use NewMigration for such tenants only
// once their records on the previous shard have expired.
func NewMigration(prev, next func(scope string) store.Store, shards ...store.Store) (*Store, error) {
	if prev == nil {
		return nil, fmt.Errorf("idemkey/store/sharded: %w: nil previous route", store.ErrInvalid)
	}
	s, err := New(next, shards...)
	if err != nil {
		return nil, err
	}
	for i, sh := range s.shards {
		if _, ok := sh.(store.Inspector); !ok {
			return nil, fmt.Errorf("idemkey/store/sharded: %w: shard %d (%T) is not a store.Inspector, which a migration reads", store.ErrInvalid, i, sh)
		}
	}
	s.prev = prev
	return s, nil
}

// placements returns the next shard of scope and, during a migration that
// moves scope, its previous shard (nil otherwise).
func (s *Store) placements(scope string) (next, prev store.Store, err error) {
	next, err = s.Shard(scope)
	if err != nil || s.prev == nil {
		return next, nil, err
	}
	prev, err = s.member(s.prev(scope))
	if err != nil || prev == next {
		return next, nil, err
	}
	return next, prev, nil
}

// claimShard returns the shard that judges a claim of id: the previous one
// when it holds a record of id, else the next.
func (s *Store) claimShard(ctx context.Context, id store.ID) (store.Store, error) {
	next, prev, err := s.placements(id.Scope)
	if err != nil || prev == nil {
		return next, err
	}
	info, err := prev.(store.Inspector).Inspect(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("idemkey/store/sharded: migration: reading the previous shard: %w", err)
	}
	if info.State != store.StateAbsent {
		return prev, nil
	}
	return next, nil
}

// holderCall runs f (a Complete, Release or Renew) on the shard that holds
// id's claim: the next one, or the previous one when the next does not hold
// the token.
func (s *Store) holderCall(id store.ID, f func(store.Store) error) error {
	next, prev, err := s.placements(id.Scope)
	if err != nil {
		return err
	}
	err = f(next)
	if prev != nil && errors.Is(err, store.ErrLeaseLost) {
		return f(prev)
	}
	return err
}
