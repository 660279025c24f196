package claim

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// sharedDeadline bounds claims whose parent context can never be cancelled
// (the middleware detaches a claim from its client, Fiber's context is
// Background) without a timer per claim: context.WithTimeout allocates a
// context and a runtime timer and stops the timer after the call, about a
// microsecond on a replay that costs the store one round trip. Claims sent
// within one step (a hundredth of the bound) share one context, whose
// deadline ends the step in which the bound runs out: each claim's deadline
// is at most its bound and at least its bound less one step, so a store that
// cannot answer still fails within the bound. A parent that can be cancelled
// or has a deadline of its own gets a context of its own, as before.
type sharedDeadline struct {
	bound time.Duration // the bound served; 0: none
	step  time.Duration // bound/100, at least 1ns
	cur   atomic.Pointer[deadlineStep]
	mu    sync.Mutex // serialises starting a step
}

// deadlineStep is the context shared by the claims of one step (a timer of
// its own, one per step), and when it ends: time since the Claimer's epoch,
// its monotonic clock.
type deadlineStep struct {
	ctx context.Context
	end time.Duration
}

// init sets the bound served.
func (s *sharedDeadline) init(bound time.Duration) {
	s.bound, s.step = bound, max(bound/100, 1)
}

// bind returns parent bounded by s.bound from now (the Claimer's monotonic
// clock) and true, or false when parent can be cancelled or has a deadline
// (the caller then bounds it itself).
func (s *sharedDeadline) bind(parent context.Context, now time.Duration) (context.Context, bool) {
	if s.bound <= 0 || parent.Done() != nil {
		return nil, false
	}
	if _, ok := parent.Deadline(); ok {
		return nil, false
	}
	latest := now + s.bound
	st := s.cur.Load()
	if st == nil || st.end > latest || st.end <= latest-s.step {
		st = s.next(now, latest)
	}
	return &boundCtx{Context: parent, deadline: st.ctx}, true
}

// next returns the step whose end is latest truncated to a whole step,
// starting it unless another claim just did.
func (s *sharedDeadline) next(now, latest time.Duration) *deadlineStep {
	end := latest - latest%s.step
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.cur.Load(); st != nil && st.end == end {
		return st
	}
	ctx, cancel := context.WithTimeout(context.Background(), end-now)
	_ = cancel // its timer ends it, at most s.bound from now
	st := &deadlineStep{ctx: ctx, end: end}
	s.cur.Store(st)
	return st
}

// boundCtx is a claim's context: the values of its parent (which is never
// cancelled), the deadline and cancellation of its step's shared context.
// Value finds the shared context's own cancellation under the context
// package's key (the parent, never cancelled, has none), so a context derived
// from it is cancelled with it without a goroutine.
type boundCtx struct {
	context.Context
	deadline context.Context
}

func (c *boundCtx) Deadline() (time.Time, bool) { return c.deadline.Deadline() }
func (c *boundCtx) Done() <-chan struct{}       { return c.deadline.Done() }
func (c *boundCtx) Err() error                  { return c.deadline.Err() }

func (c *boundCtx) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.deadline.Value(key)
}
