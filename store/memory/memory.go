// Package memory is an in-process idempotency store: the embedded default of the
// examples and the backend of unit tests.
//
// Records live in a sharded map, each shard under its own lock, so claims on
// different keys rarely contend. Leases and retention run on the process's
// monotonic clock. Expired records are swept incrementally: every write to a shard
// first removes that shard's records whose retention has passed (a min-heap by
// expiry holding each record once), so memory stays bounded by the live keys
// without a background goroutine.
//
// The store lives and dies with the process: it protects retries that reach the
// same process only. Use store/postgres, store/redis or store/tiered for several
// replicas or restarts.
package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"net/http"
	"sync"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Store is the in-memory store. The zero value is not usable; call New.
type Store struct {
	now    func() time.Time
	base   time.Time // deadlines are kept as nanoseconds since base
	seed   maphash.Seed
	shards []shard
}

var _ store.Store = (*Store)(nil)

type shard struct {
	mu      sync.Mutex
	records map[store.ID]*entry
	expiry  []*entry // min-heap by expiresAt; every record is in it exactly once
	_       [24]byte // keep shards on separate cache lines
}

// entry is one record, in flight or completed; one allocation per claimed key.
type entry struct {
	id         store.ID
	token      store.Token
	completed  bool
	index      int   // position in the shard's expiry heap
	leaseUntil int64 // holder's lease deadline, ns since Store.base
	expiresAt  int64 // retention deadline, ns since Store.base
	// rec holds the fingerprint and CreatedAt from the claim on; the response and
	// the other timestamps once completed. Claim hands out &rec only when
	// completed, and a completed entry is never written again.
	rec store.Record
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
	s.base = s.now()
	for i := range s.shards {
		s.shards[i].records = make(map[store.ID]*entry)
	}
	return s
}

func (s *Store) shard(id store.ID) *shard {
	if len(s.shards) == 1 {
		return &s.shards[0]
	}
	h := maphash.String(s.seed, id.Key) ^ maphash.String(s.seed, id.Scope)*0x9e3779b97f4a7c15
	return &s.shards[h%uint64(len(s.shards))]
}

// clock returns the store's time and the same instant as ns since base.
func (s *Store) clock() (time.Time, int64) {
	now := s.now()
	return now, int64(now.Sub(s.base))
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
	now, at := s.clock()
	sh := s.shard(req.ID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(at)

	e, ok := sh.records[req.ID]
	if ok {
		switch {
		case e.rec.Fingerprint != req.Fingerprint:
			return store.ClaimResult{Outcome: store.Mismatch}, nil
		case e.completed:
			return store.ClaimResult{Outcome: store.Completed, Record: &e.rec}, nil
		case at < e.leaseUntil:
			return store.ClaimResult{Outcome: store.InFlight, RetryAfter: time.Duration(e.leaseUntil - at)}, nil
		}
		// The holder's lease expired before it completed: take over.
		e.token = store.NewToken()
		e.leaseUntil = at + int64(req.Lease)
		e.expiresAt = at + int64(req.Retention)
		sh.fix(e.index)
		return store.ClaimResult{Outcome: store.Claimed, Token: e.token, Takeover: true}, nil
	}
	e = &entry{
		id:         req.ID,
		token:      store.NewToken(),
		leaseUntil: at + int64(req.Lease),
		expiresAt:  at + int64(req.Retention),
		rec:        store.Record{Fingerprint: req.Fingerprint, CreatedAt: now},
	}
	sh.records[req.ID] = e
	sh.push(e)
	return store.ClaimResult{Outcome: store.Claimed, Token: e.token}, nil
}

// Complete implements store.Store. The body and headers are copied.
func (s *Store) Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := store.ValidateResponse(resp, retention); err != nil {
		return err
	}
	// Copy outside the lock; the copies are dropped if the token is refused.
	header := cloneHeader(resp.Header)
	var body []byte
	if len(resp.Body) > 0 {
		body = append([]byte(nil), resp.Body...)
	}
	return s.withHolder(ctx, id, token, func(sh *shard, e *entry, now time.Time, at int64) {
		e.rec.Response = store.Response{Status: resp.Status, Header: header, Body: body, BodyOmitted: resp.BodyOmitted}
		e.rec.CompletedAt = now
		e.rec.ExpiresAt = now.Add(retention)
		e.completed = true
		e.leaseUntil = 0
		e.expiresAt = at + int64(retention)
		sh.fix(e.index)
	})
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, id store.ID, token store.Token) error {
	return s.withHolder(ctx, id, token, func(sh *shard, e *entry, _ time.Time, _ int64) {
		delete(sh.records, id)
		sh.remove(e.index)
	})
}

// Renew implements store.Store. A lease renewed past the record's retention
// extends the retention with it, so a live holder is never swept.
func (s *Store) Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("%w: lease must be positive", store.ErrInvalid)
	}
	return s.withHolder(ctx, id, token, func(sh *shard, e *entry, _ time.Time, at int64) {
		e.leaseUntil = at + int64(lease)
		if e.leaseUntil > e.expiresAt {
			e.expiresAt = e.leaseUntil
			sh.fix(e.index)
		}
	})
}

// withHolder runs f under the shard lock if token holds id's uncompleted claim.
func (s *Store) withHolder(ctx context.Context, id store.ID, token store.Token, f func(*shard, *entry, time.Time, int64)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now, at := s.clock()
	sh := s.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(at)
	e, ok := sh.records[id]
	// An expired lease still belongs to its holder until someone takes it over.
	if !ok || token.IsZero() || e.token != token || e.completed {
		return store.ErrLeaseLost
	}
	f(sh, e, now, at)
	return nil
}

// cloneHeader copies h into one map and one backing array of values (nil when
// h is empty).
func cloneHeader(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	nv := 0
	for _, v := range h {
		nv += len(v)
	}
	vals := make([]string, nv)
	out := make(http.Header, len(h))
	for k, v := range h {
		n := copy(vals, v)
		out[k] = vals[:n:n]
		vals = vals[n:]
	}
	return out
}

// sweep removes the records whose retention has passed. Called with mu held.
func (sh *shard) sweep(at int64) {
	for len(sh.expiry) > 0 && sh.expiry[0].expiresAt <= at {
		e := sh.expiry[0]
		sh.remove(0)
		delete(sh.records, e.id)
	}
}

// The expiry heap: a min-heap of entries by expiresAt, each entry knowing its
// index, so a changed deadline is fixed in place and a released entry removed.

func (sh *shard) push(e *entry) {
	e.index = len(sh.expiry)
	sh.expiry = append(sh.expiry, e)
	sh.up(e.index)
}

func (sh *shard) remove(i int) {
	h := sh.expiry
	last := len(h) - 1
	if i != last {
		sh.swap(i, last)
	}
	h[last] = nil
	sh.expiry = h[:last]
	if i != last {
		sh.fix(i)
	}
}

func (sh *shard) fix(i int) {
	if !sh.down(i) {
		sh.up(i)
	}
}

func (sh *shard) swap(i, j int) {
	h := sh.expiry
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (sh *shard) up(j int) {
	h := sh.expiry
	for j > 0 {
		i := (j - 1) / 2
		if h[i].expiresAt <= h[j].expiresAt {
			break
		}
		sh.swap(i, j)
		j = i
	}
}

// down sifts the entry at i0 down; it reports whether it moved.
func (sh *shard) down(i0 int) bool {
	h := sh.expiry
	n := len(h)
	i := i0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		j := l
		if r := l + 1; r < n && h[r].expiresAt < h[l].expiresAt {
			j = r
		}
		if h[i].expiresAt <= h[j].expiresAt {
			break
		}
		sh.swap(i, j)
		i = j
	}
	return i > i0
}
