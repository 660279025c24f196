// Package memory is an in-process idempotency store: the embedded default of the
// examples and the backend of unit tests.
//
// Records live in a sharded map, each shard under its own lock, so claims on
// different keys rarely contend. Leases and retention run on the process's
// monotonic clock. Expired records are swept incrementally: every write to a shard
// first removes that shard's records whose retention has passed (a min-heap by
// expiry), so memory stays bounded by the live keys without a background goroutine.
//
// The store lives and dies with the process: it protects retries that reach the
// same process only. Use store/postgres, store/redis or store/tiered for several
// replicas or restarts.
package memory

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Store is the in-memory store. The zero value is not usable; call New.
type Store struct {
	now    func() time.Time
	seed   maphash.Seed
	shards []shard
}

var _ store.Store = (*Store)(nil)

type shard struct {
	mu      sync.Mutex
	records map[store.ID]*entry
	expiry  expiryHeap
	_       [40]byte // keep shards on separate cache lines
}

type entry struct {
	fingerprint store.Fingerprint
	token       store.Token
	createdAt   time.Time
	leaseUntil  time.Time // deadline of the holder's lease; zero once completed
	expiresAt   time.Time // retention deadline
	record      *store.Record
}

// Option configures a Store.
type Option func(*Store)

// WithClock replaces the clock (default time.Now, which carries the monotonic
// reading). Tests pass a fake clock to move leases and retention without sleeping.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// WithShards sets the number of shards (default 64; values below 1 mean 1).
func WithShards(n int) Option {
	return func(s *Store) { s.shards = make([]shard, max(n, 1)) }
}

// New returns an empty store.
func New(opts ...Option) *Store {
	s := &Store{now: time.Now, seed: maphash.MakeSeed(), shards: make([]shard, 64)}
	for _, o := range opts {
		o(s)
	}
	for i := range s.shards {
		s.shards[i].records = make(map[store.ID]*entry)
	}
	return s
}

func (s *Store) shard(id store.ID) *shard {
	return &s.shards[maphash.Comparable(s.seed, id)%uint64(len(s.shards))]
}

// Len returns the number of records held, live or not yet swept.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.records)
		sh.mu.Unlock()
	}
	return n
}

// Claim implements store.Store.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := req.Validate(); err != nil {
		return store.ClaimResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.ClaimResult{}, err
	}
	now := s.now()
	sh := s.shard(req.ID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(now)

	e, ok := sh.records[req.ID]
	takeover := false
	if ok {
		switch {
		case e.fingerprint != req.Fingerprint:
			return store.ClaimResult{Outcome: store.Mismatch}, nil
		case e.record != nil:
			return store.ClaimResult{Outcome: store.Completed, Record: e.record}, nil
		case now.Before(e.leaseUntil):
			return store.ClaimResult{Outcome: store.InFlight, RetryAfter: e.leaseUntil.Sub(now)}, nil
		}
		takeover = true // the holder's lease expired before it completed
	} else {
		e = &entry{fingerprint: req.Fingerprint, createdAt: now}
		sh.records[req.ID] = e
	}
	e.token = store.NewToken()
	e.leaseUntil = now.Add(req.Lease)
	e.expiresAt = now.Add(req.Retention)
	sh.expiry.push(expiryItem{at: e.expiresAt, id: req.ID})
	return store.ClaimResult{Outcome: store.Claimed, Token: e.token, Takeover: takeover}, nil
}

// Complete implements store.Store. The body and headers are copied.
func (s *Store) Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := store.ValidateResponse(resp, retention); err != nil {
		return err
	}
	rec := &store.Record{Response: store.Response{
		Status:      resp.Status,
		Header:      resp.Header.Clone(),
		Body:        bytes.Clone(resp.Body),
		BodyOmitted: resp.BodyOmitted,
	}}
	return s.withHolder(ctx, id, token, func(sh *shard, e *entry, now time.Time) {
		rec.Fingerprint = e.fingerprint
		rec.CreatedAt = e.createdAt
		rec.CompletedAt = now
		rec.ExpiresAt = now.Add(retention)
		e.record = rec
		e.leaseUntil = time.Time{}
		e.expiresAt = rec.ExpiresAt
		sh.expiry.push(expiryItem{at: e.expiresAt, id: id})
	})
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, id store.ID, token store.Token) error {
	return s.withHolder(ctx, id, token, func(sh *shard, _ *entry, _ time.Time) {
		delete(sh.records, id)
	})
}

// Renew implements store.Store.
func (s *Store) Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("%w: lease must be positive", store.ErrInvalid)
	}
	return s.withHolder(ctx, id, token, func(_ *shard, e *entry, now time.Time) {
		e.leaseUntil = now.Add(lease)
	})
}

// withHolder runs f under the shard lock if token holds id's live, uncompleted claim.
func (s *Store) withHolder(ctx context.Context, id store.ID, token store.Token, f func(*shard, *entry, time.Time)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.now()
	sh := s.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(now)
	e, ok := sh.records[id]
	// An expired lease still belongs to its holder until someone takes it over.
	if !ok || token.IsZero() || e.token != token || e.record != nil {
		return store.ErrLeaseLost
	}
	f(sh, e, now)
	return nil
}

// sweep removes the records whose retention has passed. Called with mu held.
func (sh *shard) sweep(now time.Time) {
	for len(sh.expiry) > 0 && !now.Before(sh.expiry[0].at) {
		it := sh.expiry.pop()
		// Skip heap items made stale by a later Claim or Complete of the same key.
		if e, ok := sh.records[it.id]; ok && !now.Before(e.expiresAt) {
			delete(sh.records, it.id)
		}
	}
}

type expiryItem struct {
	at time.Time
	id store.ID
}

// expiryHeap is a min-heap of retention deadlines (typed, so pushing allocates
// nothing beyond the slice's growth).
type expiryHeap []expiryItem

func (h *expiryHeap) push(it expiryItem) {
	*h = append(*h, it)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !q[i].at.Before(q[p].at) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *expiryHeap) pop() expiryItem {
	q := *h
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q[last] = expiryItem{}
	q = q[:last]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < len(q) && q[l].at.Before(q[small].at) {
			small = l
		}
		if r := l + 1; r < len(q) && q[r].at.Before(q[small].at) {
			small = r
		}
		if small == i {
			break
		}
		q[i], q[small] = q[small], q[i]
		i = small
	}
	*h = q
	return top
}
