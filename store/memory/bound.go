package memory

import (
	"fmt"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/idemkey/idemkey/store"
)

// DefaultMaxBytes is the default bound on the bytes a Store keeps (WithMaxBytes):
// 64 MiB, about 200,000 records of a typical small JSON answer.
const DefaultMaxBytes = 64 << 20

// The bytes counted for each record (see WithMaxBytes), on top of its scope,
// key, header and body bytes. They follow what the store allocates for a
// record on a 64-bit platform; TestAccountingMatchesHeap pins them against the
// heap a run of records really takes.
const (
	// RecordOverhead is counted for every record, in flight or completed: the
	// entry itself (176 bytes), its word in the shard's index (index.go: 8 bytes
	// in a table a half to a quarter full, so 16 to 32 bytes a record; 16
	// counted, as for the map it replaced) and its item in the expiry queue or
	// heap (16 bytes).
	RecordOverhead = int64(unsafe.Sizeof(entry{})) + 16 + 16
	// ReplayOverhead is counted for every completed record: the store.Record a
	// replay is answered with (built at the first replay, or at a Fill), counted
	// from the start whether or not the record is ever replayed, so replays
	// cannot take the store past its bound.
	ReplayOverhead = int64(unsafe.Sizeof(store.Record{}))
	// HeaderOverhead is counted for a completed record that keeps header fields:
	// the header map a replay is answered with (one group of eight slots and the
	// map itself), besides the fields' bytes, counted twice (the stored copy and
	// the map's strings).
	HeaderOverhead = 400
)

// errFull is Claim's refusal at the bound; one value, so a refusal allocates
// nothing.
var errFull = fmt.Errorf("%w: the memory store is at its bound (memory.WithMaxBytes); retry when records expire", store.ErrFull)

// usage counts the bytes of a Store's records, shared by its shards; on its own
// cache line (64 bytes, allocated alone), since every new record writes it.
type usage struct {
	bytes   atomic.Int64
	refused atomic.Int64
	_       [48]byte
}

// WithMaxBytes bounds the bytes the store keeps (default DefaultMaxBytes; 0 or
// less: no bound, for trusted callers only). A Claim that would add a record
// while the records already take max bytes is refused with store.ErrFull: fail
// closed, a completed record is never evicted before its retention ends, and
// every key the store holds is still answered (replay, 409, 422, takeover).
// Records that expire or are released free their bytes.
//
// A Complete always completes, even when its response takes the store past the
// bound: refusing it would lose the answer of a side effect that already
// happened. The store can thus exceed max by the responses of the claims in
// flight when it filled (the middleware's storage cap bounds each body).
//
// A record is counted as RecordOverhead plus its scope and key and, once
// completed, its header fields twice (and HeaderOverhead when it has any), its
// body and ReplayOverhead. The check is made per shard under the shard's lock
// against a total shared by all shards, so concurrent claims on different
// shards can pass it together: the bound holds within a record per shard.
func WithMaxBytes(max int64) Option {
	return func(s *Store) { s.maxBytes = max }
}

// Stats is a snapshot of the store's counters.
type Stats struct {
	// Records is the number of records held, live or not yet swept (Len).
	Records int
	// Bytes is what the records are counted for (see WithMaxBytes).
	Bytes int64
	// MaxBytes is the bound (WithMaxBytes); 0 when there is none.
	MaxBytes int64
	// Refused counts the claims refused with store.ErrFull, and the cache
	// copies (Mark, Fill) not kept, since New.
	Refused int64
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{Records: s.Len(), Bytes: s.usage.bytes.Load(), MaxBytes: max(s.maxBytes, 0), Refused: s.usage.refused.Load()}
}

// size returns the bytes e is counted for (see WithMaxBytes).
func (e *entry) size() int64 {
	n := RecordOverhead + int64(len(e.id.Scope)+len(e.id.Key)+len(e.data))
	if e.status != 0 {
		n += ReplayOverhead
		if e.fieldsLen > 0 {
			n += HeaderOverhead + int64(e.fieldsLen)
		}
	}
	return n
}

// admit reports whether a new record of need bytes fits under the bound,
// counting a refusal otherwise. Called with sh's lock held, after its sweep;
// when the store looks full, the other shards are swept first (those not
// locked now), since their expired records count until a call sweeps them.
func (s *Store) admit(sh *shard, need, at int64) bool {
	if s.maxBytes <= 0 {
		return true
	}
	if s.usage.bytes.Load()+need <= s.maxBytes {
		return true
	}
	for i := range s.shards {
		if o := &s.shards[i]; o != sh && o.mu.TryLock() {
			o.sweep(at)
			o.mu.Unlock()
		}
	}
	if s.usage.bytes.Load()+need <= s.maxBytes {
		return true
	}
	s.usage.refused.Add(1)
	return false
}

// grow counts n more bytes (negative: freed).
func (sh *shard) grow(n int64) { sh.usage.bytes.Add(n) }

// ownID returns id in memory of its own, one allocation for scope and key: a
// caller's strings may be slices of far more (the Fiber adapters copy a
// request's whole header block into one string), which a record would keep
// for its retention while the bound counts only len(Scope)+len(Key).
func ownID(id store.ID) store.ID {
	var b strings.Builder
	b.Grow(len(id.Scope) + len(id.Key))
	b.WriteString(id.Scope)
	b.WriteString(id.Key)
	s := b.String()
	return store.ID{Scope: s[:len(id.Scope)], Key: s[len(id.Scope):]}
}
