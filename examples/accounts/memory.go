package accounts

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
)

// MemoryProjection keeps each replica's projection and dedup index in process memory
// (docs/account-service.md section 4.1). Cursor and index live in one map under one mutex, never held
// across I/O. Index entries from a fold live for the window minus their age in server
// time; the writer's own entry lives the full window from the write (scenario 8). The
// remaining lifetime runs on the local monotonic clock.
//
// Expired entries are dropped during every fold of the account and, so that a replica
// whose own writes keep its cursor current (and so never folds) does not grow without
// bound, whenever an account's entries have doubled since the last sweep (amortised O(1)
// per write). The account map is unbounded (as in the reference): fine for the example,
// not for production.
type MemoryProjection struct {
	window time.Duration
	now    func() time.Time

	mu       sync.Mutex
	accounts map[uuid.UUID]*memAccount
}

type memAccount struct {
	name    string
	st      State
	recent  map[uuid.UUID]memEntry
	sweepAt int // len(recent) at which recordWrite sweeps expired entries
}

// minSweep is the smallest sweepAt: below it an account's index is never swept by
// recordWrite.
const minSweep = 64

type memEntry struct {
	res     Result
	expires time.Time
}

// MemoryOption configures a MemoryProjection.
type MemoryOption func(*MemoryProjection)

// WithMemoryWindow sets the dedup window (default DefaultWindow). Non-positive values are
// ignored.
func WithMemoryWindow(d time.Duration) MemoryOption {
	return func(p *MemoryProjection) {
		if d > 0 {
			p.window = d
		}
	}
}

// WithMemoryClock sets the local clock that runs index lifetimes (default time.Now, which
// is monotonic). Tests use it to expire the window without sleeping.
func WithMemoryClock(now func() time.Time) MemoryOption {
	return func(p *MemoryProjection) {
		if now != nil {
			p.now = now
		}
	}
}

// NewMemoryProjection returns an empty in-memory projection.
func NewMemoryProjection(opts ...MemoryOption) *MemoryProjection {
	p := &MemoryProjection{window: DefaultWindow, now: time.Now, accounts: make(map[uuid.UUID]*memAccount)}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Window returns the dedup window.
func (p *MemoryProjection) Window() time.Duration { return p.window }

// account returns the entry of acct, creating it. Callers hold p.mu.
func (p *MemoryProjection) account(acct uuid.UUID) *memAccount {
	a := p.accounts[acct]
	if a == nil {
		a = &memAccount{recent: make(map[uuid.UUID]memEntry), sweepAt: minSweep}
		p.accounts[acct] = a
	}
	return a
}

// hitLocked returns the live entry of eventID. Callers hold p.mu.
func (a *memAccount) hitLocked(eventID uuid.UUID, now time.Time) (Result, bool) {
	if eventID == uuid.Nil {
		return Result{}, false
	}
	e, ok := a.recent[eventID]
	if !ok || !e.expires.After(now) {
		return Result{}, false
	}
	return e.res, true
}

func (p *MemoryProjection) lookup(_ context.Context, acct, eventID uuid.UUID) (State, Result, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.accounts[acct]
	if a == nil {
		return State{}, Result{}, false, nil
	}
	hit, ok := a.hitLocked(eventID, p.now())
	return a.st, hit, ok, nil
}

func (p *MemoryProjection) fold(_ context.Context, acct uuid.UUID, _ State, batches []celeriant.Batch, clientID, eventID uuid.UUID, precision celeriant.Precision) (State, Result, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.account(acct)
	now := p.now()
	// Fold from the current state, not the caller's snapshot: a sibling request may have
	// folded some of these batches while we read them; foldBatches skips those.
	a.st = foldBatches(a.st, batches, clientID, p.window, precision, func(e indexEntry) {
		exp := now.Add(e.remaining)
		if old, ok := a.recent[e.eventID]; ok && old.expires.After(exp) {
			exp = old.expires // an expiry never shrinks
		}
		a.recent[e.eventID] = memEntry{res: e.res, expires: exp}
	})
	a.sweepLocked(now)
	hit, ok := a.hitLocked(eventID, now)
	return a.st, hit, ok, nil
}

func (p *MemoryProjection) recordWrite(_ context.Context, acct, eventID uuid.UUID, res Result, expected, seq uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.account(acct)
	// The index entry first and unconditionally, with the full window: once the cursor
	// bump below wins, this replica never re-folds its own batch.
	now := p.now()
	a.recent[eventID] = memEntry{res: res, expires: now.Add(p.window)}
	if len(a.recent) >= a.sweepAt {
		a.sweepLocked(now)
	}
	if a.st.Version == expected {
		a.st.BalanceCents = res.BalanceCents
		a.st.Version = res.AggregateVersion
		a.st.MaxClientSeq = max(a.st.MaxClientSeq, seq)
	}
	return nil
}

// sweepLocked drops the expired entries and sets the next sweep point to twice the
// live count, so each sweep's cost is paid by at least as many inserts. Callers hold p.mu.
func (a *memAccount) sweepLocked(now time.Time) {
	for id, e := range a.recent {
		if !e.expires.After(now) {
			delete(a.recent, id)
		}
	}
	a.sweepAt = max(2*len(a.recent), minSweep)
}

func (p *MemoryProjection) ensureAccount(_ context.Context, acct uuid.UUID, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.account(acct)
	if a.name == "" {
		a.name = name
	}
	return nil
}
