package memory

import (
	"context"
	"time"

	"github.com/idemkey/idemkey/store"
)

// The Store is also a tiered.Cache: tiered.New(memory.New(), pg) keeps an
// in-process copy of the records in front of an authoritative store, so a
// replay of a hot key costs no round trip (docs/stores.md section 5.4). A
// completed record never changes, so a copy is safe; an in-flight marker is the
// backstop's claim seen from this process, and expires with its lease. The
// cache holds at most the store's bound (WithMaxBytes): when full, Mark and Fill
// keep nothing (counted in Stats.Refused) and the backstop answers those keys,
// and a Complete of a marker still completes it. Complete, Release and Renew
// of the marker are the store.Store methods.

// Peek implements tiered.Cache: under the key's shard lock, after its sweep, a
// completed record is Completed (the same fingerprint) or Mismatch (another),
// and a marker of the same fingerprint whose lease is live is InFlight; ok is
// false otherwise. The replay allocates nothing once the record was replayed
// before. Errors: store.ErrInvalid, or ctx's.
func (s *Store) Peek(ctx context.Context, id store.ID, fp store.Fingerprint) (res store.ClaimResult, ok bool, err error) {
	if err := id.Validate(); err != nil {
		return res, false, err
	}
	if err := ctx.Err(); err != nil {
		return res, false, err
	}
	sh, h, at := s.lockSwept(id)
	defer sh.mu.Unlock()
	e := sh.find(sh.records.get(sh, h), id)
	switch {
	case e == nil:
		return res, false, nil
	case e.status != 0 && e.fingerprint != fp:
		return store.ClaimResult{Outcome: store.Mismatch}, true, nil
	case e.status != 0:
		if e.rec == nil {
			e.rec = s.record(e)
		}
		return store.ClaimResult{Outcome: store.Completed, Record: e.rec}, true, nil
	case e.fingerprint == fp && at < e.until:
		return store.ClaimResult{Outcome: store.InFlight, RetryAfter: time.Duration(e.until - at)}, true, nil
	}
	return res, false, nil
}

// Mark implements tiered.Cache: id holds an in-flight marker of token for
// lease from now, replacing whatever it held (its waiters are woken). When the
// store is full and id held nothing, nothing is kept (nil error: the backstop
// answers the key). Errors: store.ErrInvalid (ValidateHolder, ValidateLease), or
// ctx's.
func (s *Store) Mark(ctx context.Context, id store.ID, fp store.Fingerprint, token store.Token, lease time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateLease(lease); err != nil {
		return err
	}
	return s.put(ctx, id, true, func(e *entry, at int64) {
		e.fingerprint, e.token, e.createdAt, e.until = fp, token, at, at+int64(lease)
	}, lease)
}

// Fill implements tiered.Cache: unless id holds a record or a marker, it holds
// a copy of rec (its times as given, on the backstop's clock) for ttl from now.
// When the store is full nothing is kept (nil error). Errors: store.ErrInvalid
// (store.ValidateRecord), or ctx's.
func (s *Store) Fill(ctx context.Context, id store.ID, rec *store.Record, ttl time.Duration) error {
	if err := store.ValidateRecord(id, rec, ttl); err != nil {
		return err
	}
	data, fieldsLen := copyResponse(rec.Header, rec.Body)
	return s.put(ctx, id, false, func(e *entry, at int64) {
		e.fingerprint, e.status, e.omitted, e.data, e.fieldsLen = rec.Fingerprint, int32(rec.Status), rec.BodyOmitted, data, int32(fieldsLen)
		e.createdAt, e.until = at, at
		cp := s.record(e)
		cp.CreatedAt, cp.CompletedAt, cp.ExpiresAt = rec.CreatedAt, rec.CompletedAt, rec.ExpiresAt
		e.rec = cp
	}, ttl)
}

// put writes id's record with set, to expire after ttl: over the record id
// holds when replace is set (set starts from an in-flight entry), as a new
// record otherwise and only when id holds none. A new record the bound does
// not admit is not kept.
func (s *Store) put(ctx context.Context, id store.ID, replace bool, set func(e *entry, at int64), ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sh, h, at := s.lockSwept(id)
	defer sh.mu.Unlock()
	if e := sh.find(sh.records.get(sh, h), id); e != nil {
		if !replace {
			return nil
		}
		before := e.size()
		e.end()
		e.status, e.omitted, e.data, e.fieldsLen, e.rec = 0, false, nil, 0, nil
		set(e, at)
		sh.grow(e.size() - before)
		sh.setExpiry(e, at+int64(ttl))
		return nil
	}
	rec := entry{id: ownID(id), hash: h, next: sh.records.get(sh, h), expiresAt: at + int64(ttl)}
	set(&rec, at)
	if !s.admit(sh, rec.size(), at) {
		return nil
	}
	e := sh.alloc()
	rec.self = e.self
	*e = rec
	sh.records.set(sh, h, e.self)
	sh.push(e)
	sh.grow(e.size())
	return nil
}
