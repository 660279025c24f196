// Package memory is an in-process idempotency store: the embedded default of the
// examples and the backend of unit tests.
//
// Records live in shards, each under its own lock, so claims on
// different keys rarely contend; a shard keeps them in blocks of entries and
// refers to them by slot, without pointers for the garbage collector to follow
// (arena.go). A record is found by a 64-bit seeded hash of its
// scope and key (hashed once per call; it also picks the shard), records whose IDs
// share a hash chained behind it. Leases and retention run on the process's
// monotonic clock. Expired records are swept incrementally: every write to a shard
// first removes that shard's records whose retention has passed, so memory stays
// bounded by the live keys without a background goroutine. Each record is in one
// of two expiry structures, once: a FIFO queue takes the deadlines that arrive in
// order (one retention for every key, the common case), O(1) a record; a min-heap
// takes the others.
//
// The bytes the store keeps are bounded (WithMaxBytes, 64 MiB by default): when
// full it refuses new keys with store.ErrFull and evicts nothing. The store is
// also a tiered.Cache (Peek, Mark, Fill): an in-process copy of the records in
// front of an authoritative store (docs/stores.md section 5.4).
//
// The store lives and dies with the process: it protects retries that reach the
// same process only. Use store/postgres, store/redis or store/tiered for several
// replicas or restarts.
package memory

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/maphash"
	"net/http"
	"sync"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Store is the in-memory store. The zero value is not usable; call New.
type Store struct {
	now  func() time.Time
	mono bool      // now is time.Now: read only the monotonic clock (time.Since)
	base time.Time // deadlines are kept as nanoseconds since base
	seed maphash.Seed
	// hashMask keeps these bits of hash: all of them, except in tests, which
	// clear some to make IDs share a hash.
	hashMask uint64
	shards   []shard
	maxBytes int64  // the bound of WithMaxBytes; 0 or less: none
	usage    *usage // shared by the shards
}

var (
	_ store.Store  = (*Store)(nil)
	_ store.Waiter = (*Store)(nil)
)

type shard struct {
	mu sync.Mutex
	// records maps an ID's hash (Store.hash) to its record's slot (index.go);
	// records of other IDs with the same hash follow it through entry.next
	// (arena.go).
	records index
	blocks  []*block // the records, slots 1..n
	spare   *block   // an emptied block kept for the next one needed
	n       int32
	// Every record is in exactly one of expiry and queue (entry.queued says which).
	expiry []heapItem // min-heap by expiry
	queue  queue      // FIFO by expiry, for deadlines that arrive in order
	usage  *usage     // the Store's byte count (bound.go)
	_      [32]byte   // keep shards on separate cache lines
}

// heapItem is a record in the expiry heap or queue; at (its expiresAt, or
// earlier in the queue) is kept inline so ordering reads no entry. ref 0 is a
// tombstone in the queue.
type heapItem struct {
	at  int64
	ref ref
}

// entry is one record, in flight or completed, in a slot of its shard's
// blocks (arena.go), kept small because most records are never replayed (176
// bytes). Times are ns since Store.base.
type entry struct {
	id          store.ID
	hash        uint64 // Store.hash(id)
	self        ref    // its slot
	next        ref    // the next record whose ID has the same hash
	token       store.Token
	fingerprint store.Fingerprint
	// until is the holder's lease deadline while in flight (status 0), and when
	// the record completed once completed: a record has only one of the two.
	until     int64
	expiresAt int64 // retention deadline
	createdAt int64
	index     int32 // position in the shard's expiry heap, or sequence number in its queue (as uint32)
	status    int32 // the stored status; 0 while in flight
	omitted   bool
	queued    bool // in the shard's queue, not its heap
	// data holds the stored header, its first fieldsLen bytes, as
	// length-prefixed name, value pairs (a name repeated for each of its values;
	// see appendFields), then the body: one allocation, with no pointers to
	// scan, costs less than a map.
	fieldsLen int32
	data      []byte
	// rec is the record Claim hands out, built at the first replay and never
	// written again.
	rec *store.Record
	// ended is closed when the claim in flight ends (completed, released or
	// swept); made by the first Wait, so a key nobody waits for costs nothing.
	ended chan struct{}
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

// New returns an empty store, bounded to DefaultMaxBytes unless WithMaxBytes
// says otherwise.
func New(opts ...Option) *Store {
	s := &Store{seed: maphash.MakeSeed(), hashMask: ^uint64(0), shards: make([]shard, 64), maxBytes: DefaultMaxBytes, usage: new(usage)}
	for _, o := range opts {
		o(s)
	}
	if s.now == nil {
		s.now, s.mono = time.Now, true
	}
	s.base = s.now()
	for i := range s.shards {
		s.shards[i].queue.sh = &s.shards[i]
		s.shards[i].usage = s.usage
	}
	return s
}

// hash returns the seeded hash of id that finds its shard and its record.
func (s *Store) hash(id store.ID) uint64 {
	return (maphash.String(s.seed, id.Key) ^ maphash.String(s.seed, id.Scope)*0x9e3779b97f4a7c15) & s.hashMask
}

func (s *Store) shard(h uint64) *shard {
	return &s.shards[h%uint64(len(s.shards))]
}

// clock returns the store's time as ns since base.
func (s *Store) clock() int64 {
	if s.mono {
		return int64(time.Since(s.base)) // the same reading, without the wall clock
	}
	return int64(s.now().Sub(s.base))
}

// time returns the instant at ns since base.
func (s *Store) time(at int64) time.Time { return s.base.Add(time.Duration(at)) }

// record builds the record of the completed e.
func (s *Store) record(e *entry) *store.Record {
	rec := &store.Record{
		Fingerprint: e.fingerprint,
		Response:    store.Response{Status: int(e.status), Body: e.body(), BodyOmitted: e.omitted},
		CreatedAt:   s.time(e.createdAt),
		CompletedAt: s.time(e.until),
		ExpiresAt:   s.time(e.expiresAt),
	}
	if e.fieldsLen > 0 {
		rec.Header = headerFromFields(e.data[:e.fieldsLen])
	}
	return rec
}

// body returns the stored body (nil when empty).
func (e *entry) body() []byte {
	if len(e.data) == int(e.fieldsLen) {
		return nil
	}
	return e.data[e.fieldsLen:]
}

// Len returns the number of records held, live or not yet swept.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.expiry) + sh.queue.live()
		sh.mu.Unlock()
	}
	return n
}

// InProcess implements store.InProcess: the memory store never waits on I/O, so
// the middleware puts no deadline on its calls.
func (s *Store) InProcess() bool { return true }

// Claim implements store.Store.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := req.Validate(); err != nil {
		return store.ClaimResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.ClaimResult{}, err
	}
	at := s.clock()
	h := s.hash(req.ID)
	sh := s.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(at)

	head := sh.records.get(sh, h)
	if e := sh.find(head, req.ID); e != nil {
		switch {
		case e.fingerprint != req.Fingerprint:
			return store.ClaimResult{Outcome: store.Mismatch}, nil
		case e.status != 0:
			if e.rec == nil {
				e.rec = s.record(e)
			}
			return store.ClaimResult{Outcome: store.Completed, Record: e.rec}, nil
		case at < e.until:
			return store.ClaimResult{Outcome: store.InFlight, RetryAfter: time.Duration(e.until - at)}, nil
		}
		// The holder's lease expired before it completed: take over.
		e.token = req.ClaimToken()
		e.until = at + int64(req.Lease)
		sh.setExpiry(e, at+int64(req.Retention))
		return store.ClaimResult{Outcome: store.Claimed, Token: e.token, Takeover: true}, nil
	}
	if !s.admit(sh, RecordOverhead+int64(len(req.Scope)+len(req.Key)), at) {
		return store.ClaimResult{}, errFull
	}
	e := sh.alloc()
	*e = entry{
		id:          ownID(req.ID),
		hash:        h,
		self:        e.self,
		next:        head,
		token:       req.ClaimToken(),
		fingerprint: req.Fingerprint,
		until:       at + int64(req.Lease),
		expiresAt:   at + int64(req.Retention),
		createdAt:   at,
	}
	sh.records.set(sh, h, e.self)
	sh.push(e)
	sh.grow(e.size())
	return store.ClaimResult{Outcome: store.Claimed, Token: e.token}, nil
}

// Complete implements store.Store. The body and headers are copied. It
// completes even past the store's bound (see WithMaxBytes).
func (s *Store) Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateResponse(resp, retention); err != nil {
		return err
	}
	// Copy outside the lock, into one array; dropped if the token is refused.
	data, fieldsLen := copyResponse(resp.Header, resp.Body)
	same := func(e *entry) bool { // completed with resp already: a retried completion
		return e.status == int32(resp.Status) && e.omitted == resp.BodyOmitted && bytes.Equal(e.data[e.fieldsLen:], resp.Body)
	}
	return s.withHolder(ctx, id, token, same, func(sh *shard, e *entry, at int64) {
		before := e.size()
		e.status, e.omitted, e.data, e.fieldsLen = int32(resp.Status), resp.BodyOmitted, data, int32(fieldsLen)
		sh.grow(e.size() - before)
		e.until = at // now the completion time
		sh.setExpiry(e, at+int64(retention))
		e.end()
	})
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, id store.ID, token store.Token) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	return s.withHolder(ctx, id, token, nil, func(sh *shard, e *entry, _ int64) {
		sh.drop(e)
	})
}

// Renew implements store.Store. A lease renewed past the record's retention
// extends the retention with it, so a live holder is never swept.
func (s *Store) Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateLease(lease); err != nil {
		return err
	}
	return s.withHolder(ctx, id, token, nil, func(sh *shard, e *entry, at int64) {
		e.until = at + int64(lease)
		if e.until > e.expiresAt {
			sh.setExpiry(e, e.until)
		}
	})
}

// lockSwept locks the shard of id, after which its records past their
// retention are swept, and returns it with id's hash and the store time. The
// caller unlocks sh.mu.
func (s *Store) lockSwept(id store.ID) (sh *shard, h uint64, at int64) {
	at = s.clock()
	h = s.hash(id)
	sh = s.shard(h)
	sh.mu.Lock()
	sh.sweep(at)
	return sh, h, at
}

// withHolder runs f under the shard lock if token holds id's uncompleted claim.
// A record token completed answers nil, leaving it as it is, when done (if not
// nil) says it is the one f would write.
func (s *Store) withHolder(ctx context.Context, id store.ID, token store.Token, done func(*entry) bool, f func(*shard, *entry, int64)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sh, h, at := s.lockSwept(id)
	defer sh.mu.Unlock()
	e := sh.find(sh.records.get(sh, h), id)
	// An expired lease still belongs to its holder until someone takes it over.
	if e == nil || e.token != token {
		return store.ErrLeaseLost
	}
	if e.status != 0 {
		if done != nil && done(e) {
			return nil
		}
		return store.ErrLeaseLost
	}
	f(sh, e, at)
	return nil
}

// Wait implements store.Waiter with an in-process channel per waited-for key:
// every waiter of a key selects on the same channel, which Complete, Release or
// the sweep closes, so one end wakes them all and no goroutine is started. It
// returns nil at once when id holds no live claim, ctx.Err() when ctx ends first.
func (s *Store) Wait(ctx context.Context, id store.ID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	at := s.clock()
	h := s.hash(id)
	sh := s.shard(h)
	sh.mu.Lock()
	sh.sweep(at)
	e := sh.find(sh.records.get(sh, h), id)
	if e == nil || e.status != 0 || at >= e.until {
		sh.mu.Unlock()
		return nil
	}
	if e.ended == nil {
		e.ended = make(chan struct{})
	}
	ended := e.ended
	sh.mu.Unlock()
	select {
	case <-ended:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// end wakes the waiters of e's claim. Called with the shard lock held.
func (e *entry) end() {
	if e.ended != nil {
		close(e.ended)
		e.ended = nil
	}
}

// copyResponse copies h (see appendFields) and then body into one array (nil
// when both are empty), and returns it with the length of the header part.
func copyResponse(h http.Header, body []byte) (data []byte, fieldsLen int) {
	var scratch [512]byte // a typical header fits: h is walked once
	f := appendFields(scratch[:0], h)
	if len(f)+len(body) == 0 {
		return nil, 0
	}
	data = make([]byte, len(f)+len(body))
	copy(data, f)
	copy(data[len(f):], body)
	return data, len(f)
}

// appendFields appends each value of h as the uvarint length of its name, the
// name, the uvarint length of the value and the value.
func appendFields(b []byte, h http.Header) []byte {
	for k, vs := range h {
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(k)))
			b = append(b, k...)
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

// headerFromFields builds the header map of what appendFields wrote, values of
// one name in their order, in one backing array of values.
func headerFromFields(fields []byte) http.Header {
	var pairs []string
	for len(fields) > 0 {
		for range 2 {
			n, w := binary.Uvarint(fields)
			pairs = append(pairs, string(fields[w:w+int(n)]))
			fields = fields[w+int(n):]
		}
	}
	h := make(http.Header, len(pairs)/2)
	vals := make([]string, len(pairs)/2)
	for i := 0; i < len(pairs); i += 2 {
		k := pairs[i]
		if _, done := h[k]; done {
			continue
		}
		n := 0
		for j := i; j < len(pairs); j += 2 {
			if pairs[j] == k {
				vals[n] = pairs[j+1]
				n++
			}
		}
		h[k] = vals[:n:n]
		vals = vals[n:]
	}
	return h
}

// drop removes e from the records and from the expiry heap or queue, wakes its
// waiters and frees its slot (e is then another record's, or none). Called with
// mu held.
func (sh *shard) drop(e *entry) {
	switch head := sh.records.get(sh, e.hash); {
	case head == e.self && e.next == 0:
		sh.records.del(sh, e.hash)
	case head == e.self:
		sh.records.set(sh, e.hash, e.next)
	default:
		for p := sh.at(head); ; p = sh.at(p.next) {
			if p.next == e.self {
				p.next = e.next
				break
			}
		}
	}
	sh.grow(-e.size())
	if e.queued {
		sh.queue.remove(e)
	} else {
		sh.remove(int(e.index))
	}
	e.end()
	sh.free(e)
}

// sweep removes the records whose retention has passed. Called with mu held.
// A queued record whose deadline moved later is queued again at its deadline
// instead, once: the sweep visits at most the records that expired and those.
func (sh *shard) sweep(at int64) {
	for len(sh.expiry) > 0 && sh.expiry[0].at <= at {
		sh.drop(sh.at(sh.expiry[0].ref))
	}
	q := &sh.queue
	for q.len() > 0 {
		it := q.item(q.head) // never a tombstone
		if it.at > at {
			break
		}
		e := sh.at(it.ref)
		if e.expiresAt > at {
			q.remove(e)
			sh.push(e) // at a deadline after at: not seen again here
			continue
		}
		sh.drop(e)
	}
}

// push adds e at its deadline (e.expiresAt): to the queue when no queued
// deadline is later, to the heap otherwise.
func (sh *shard) push(e *entry) {
	if q := &sh.queue; q.len() == 0 || q.item(q.tail-1).at <= e.expiresAt {
		q.push(e)
		return
	}
	i := len(sh.expiry)
	e.index = int32(i)
	sh.expiry = append(sh.expiry, heapItem{at: e.expiresAt, ref: e.self})
	sh.up(i)
}

// setExpiry changes e's retention deadline. A queued record keeps its place
// when the deadline moves later (its item's deadline is then a lower bound, and
// the sweep queues it again when it comes up), and is updated in place when it
// is the last queued; a deadline moved earlier takes it out and pushes it again.
func (sh *shard) setExpiry(e *entry, at int64) {
	if !e.queued {
		e.expiresAt = at
		sh.expiry[e.index].at = at
		sh.fix(int(e.index))
		return
	}
	q := &sh.queue
	it := q.item(uint32(e.index))
	switch {
	case at < it.at:
		q.remove(e)
		e.expiresAt = at
		sh.push(e)
		return
	case uint32(e.index) == q.tail-1:
		it.at = at
	}
	e.expiresAt = at
}

// The expiry heap: a min-heap of entries by expiresAt, each entry knowing its
// index, so a changed deadline is fixed in place and a released entry removed.

func (sh *shard) remove(i int) {
	h := sh.expiry
	last := len(h) - 1
	if i != last {
		sh.swap(i, last)
	}
	h[last] = heapItem{}
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
	sh.at(h[i].ref).index, sh.at(h[j].ref).index = int32(i), int32(j)
}

func (sh *shard) up(j int) {
	h := sh.expiry
	for j > 0 {
		i := (j - 1) / 2
		if h[i].at <= h[j].at {
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
		if r := l + 1; r < n && h[r].at < h[l].at {
			j = r
		}
		if h[i].at <= h[j].at {
			break
		}
		sh.swap(i, j)
		i = j
	}
	return i > i0
}
