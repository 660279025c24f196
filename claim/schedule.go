package claim

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Scheduling the first renewal. Most executions end long before their first
// renewal is due (a third of the lease after the claim's send), so on the real
// clock (RealClock) Start does not arm a timer of its own: it links the
// execution into one of the Claimer's lists of young executions, and Stop
// unlinks it, each under a lock few other goroutines take (one of youngLists,
// picked at random per Execution), with no clock read. One sweep timer per
// Claimer runs every sweepEvery of the lease while executions are young: each
// sweep takes every execution out of the lists and arms its own timer for its
// first renewal, still due exactly a third of the lease after its claim was
// sent. From then on nothing differs (execution.go).
//
// Why no renewal is late: an execution is linked only when its claim was sent
// after the latest sweep began (else Start arms its timer at once), and that
// sweep ran at most a sweep period ago, so the next sweep, at most a period
// later, finds it at most two periods after its send: a third of the lease is
// four periods, which leaves two periods (a sixth of the lease) for that sweep
// to run late. Sweeps are a period apart from start to start, and each counts an
// execution's delay when it reaches it: the time a sweep spends arming timers
// (many executions, a loaded machine) is not added to any renewal. A sweep that
// finds no young execution stops the timer; the next Start arms its own timer,
// and the sweep timer again.
//
// Custom clocks (Config.Clock, tests' fake clocks) keep one timer per execution:
// the sweep's arithmetic reads the real clock.
const (
	youngLists = 16
	sweepEvery = 12 // sweeps per lease
)

// youngList is one list of executions whose first renewal is not scheduled yet,
// linked through Execution.ynext and yprev.
type youngList struct {
	mu   sync.Mutex
	head *Execution
	_    [48]byte // a cache line each
}

// scheduler holds a Claimer's young executions and its sweep timer.
type scheduler struct {
	cl     *Claimer
	period time.Duration // the lease / sweepEvery
	lists  [youngLists]youngList
	armed  atomic.Bool  // the sweep timer is armed or a sweep runs
	last   atomic.Int64 // when the latest sweep began: ns since cl.epoch
	// timer is made by the first wake and then used only by whoever set armed:
	// the wake that did, then the sweeps it schedules.
	timer *time.Timer
}

func newScheduler(cl *Claimer) *scheduler {
	return &scheduler{cl: cl, period: cl.cfg.Lease / sweepEvery}
}

// add links e, whose claim was sent at sent (since cl.epoch), into a young list,
// after Start has set everything the sweep reads (e.cl, e.sent, e.stopped). It
// reports false, and links nothing, when the sweep timer is not armed (it arms
// it) or the claim was sent before the latest sweep began: then Start arms e's
// own timer.
func (s *scheduler) add(e *Execution, sent time.Duration) bool {
	if !s.armed.Load() {
		s.wake()
		return false
	}
	if sent <= time.Duration(s.last.Load()) {
		return false
	}
	if e.ysched != s {
		e.ysched, e.ylist = s, &s.lists[rand.N(youngLists)]
	}
	l := e.ylist
	l.mu.Lock()
	e.yprev, e.ynext, e.linked = nil, l.head, true
	if l.head != nil {
		l.head.yprev = e
	}
	l.head = e
	l.mu.Unlock()
	if !s.armed.Load() { // the timer stopped meanwhile, maybe before the sweep could see e
		s.wake()
	}
	return true
}

// remove unlinks e if it is still young, and reports whether it was: then no
// timer was ever armed for it.
func (s *scheduler) remove(e *Execution) bool {
	l := e.ylist
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !e.linked {
		return false
	}
	if e.yprev != nil {
		e.yprev.ynext = e.ynext
	} else {
		l.head = e.ynext
	}
	if e.ynext != nil {
		e.ynext.yprev = e.yprev
	}
	e.yprev, e.ynext, e.linked = nil, nil, false
	return true
}

// wake arms the sweep timer unless it is armed.
//
// last is moved to now before armed is set: an add that sees the timer armed
// must see a time no older than its arming, or it would link an execution
// whose claim was sent while the sweeps were stopped (last is then the stopped
// sweep's start, any time ago), which the first sweep, a period on, could find
// past its renewal's due time. last only grows here (a wake whose CompareAndSwap
// loses may read the clock before the winner); a later last only makes more
// executions arm their own timers.
func (s *scheduler) wake() {
	if s.armed.Load() {
		return
	}
	now := int64(time.Since(s.cl.epoch))
	for old := s.last.Load(); old < now && !s.last.CompareAndSwap(old, now); old = s.last.Load() {
	}
	if !s.armed.CompareAndSwap(false, true) {
		return
	}
	if s.timer == nil {
		// Made idle, then armed by Reset: the sweep may read s.timer only once
		// the field is set, and Reset orders this write before the sweep runs (a
		// timer made armed could fire before the assignment, or be read without
		// it by a sweep: a nil Reset).
		s.timer = time.AfterFunc(math.MaxInt64, s.sweep)
	}
	s.timer.Reset(s.period)
}

// sweep arms the first renewal of every young execution, and runs again a
// period later, or stops when there was none.
func (s *scheduler) sweep() {
	now := s.cl.now()
	s.last.Store(int64(now.Sub(s.cl.epoch)))
	found := false
	for i := range s.lists {
		l := &s.lists[i]
		l.mu.Lock()
		for e := l.head; e != nil; {
			next := e.ynext
			e.yprev, e.ynext, e.linked = nil, nil, false
			e.armFirst()
			e, found = next, true
		}
		l.head = nil
		l.mu.Unlock()
	}
	if found {
		// A period after this sweep began, not after it ended: executions linked
		// since it began (or since it passed their list) wait for the next one.
		s.timer.Reset(max(s.period-s.cl.now().Sub(now), 0))
		return
	}
	s.armed.Store(false)
	for i := range s.lists { // an add that saw the timer armed may have linked since
		l := &s.lists[i]
		l.mu.Lock()
		young := l.head != nil
		l.mu.Unlock()
		if young {
			s.wake()
			return
		}
	}
}
