package memory

import (
	"context"

	"github.com/idemkey/idemkey/store"
)

var _ store.Inspector = (*Store)(nil)

// Inspect implements store.Inspector under the key's shard lock. It sweeps
// nothing: a record past its retention is reported absent and left for the next
// write to the shard.
func (s *Store) Inspect(ctx context.Context, id store.ID) (store.Info, error) {
	if err := store.ValidateInspect(id); err != nil {
		return store.Info{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Info{}, err
	}
	at := s.clock()
	h := s.hash(id)
	sh := s.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return s.info(sh.find(sh.records.get(sh, h), id), at), nil
}

// Evict implements store.Inspector: the decision and the removal happen under the
// key's shard lock.
func (s *Store) Evict(ctx context.Context, id store.ID, policy store.EvictPolicy) (store.Info, bool, error) {
	if err := store.ValidateEvict(id, policy); err != nil {
		return store.Info{}, false, err
	}
	if err := ctx.Err(); err != nil {
		return store.Info{}, false, err
	}
	sh, h, at := s.lockSwept(id)
	defer sh.mu.Unlock()
	e := sh.find(sh.records.get(sh, h), id)
	found := s.info(e, at)
	if !policy.Allows(found) {
		return found, false, nil
	}
	sh.drop(e)
	return found, true, nil
}

// info describes e (nil: absent) at the store time at. Called with the shard lock held.
func (s *Store) info(e *entry, at int64) store.Info {
	in := store.Info{Now: s.time(at)}
	if e == nil || e.expiresAt <= at {
		return in
	}
	in.Fingerprint = e.fingerprint
	in.CreatedAt = s.time(e.createdAt)
	in.ExpiresAt = s.time(e.expiresAt)
	if e.status == 0 {
		in.State = store.StateInFlight
		in.LeaseUntil = s.time(e.until)
		return in
	}
	in.State = store.StateCompleted
	in.CompletedAt = s.time(e.until)
	in.Status = int(e.status)
	in.BodyBytes = len(e.body())
	in.BodyOmitted = e.omitted
	return in
}
