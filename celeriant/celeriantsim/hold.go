package celeriantsim

import (
	"sync"
	"time"
)

// DefaultCommitDelay is the commit delay of a Sim whose Options leave CommitDelay zero:
// a few milliseconds, the order of the server's fsync window.
const DefaultCommitDelay = 2 * time.Millisecond

// NoCommitDelay, as Options.CommitDelay, commits every write at once, before its answer.
const NoCommitDelay time.Duration = -1

// Hold is a write kept in flight: validated, versioned and its sequence floor raised, but
// not committed, so reads do not see it and an enforced write with a sequence at or
// below its floor gets 2013 (docs/celeriant-protocol.md section 6.5).
type Hold struct {
	prepared chan struct{}
	commit   chan struct{}
	done     chan struct{} // closed once the write is committed (visible)
	once     sync.Once
}

func newHold() *Hold {
	return &Hold{prepared: make(chan struct{}), commit: make(chan struct{}), done: make(chan struct{})}
}

// Prepared is closed once the held write has been prepared (or answered with an error).
func (h *Hold) Prepared() <-chan struct{} { return h.prepared }

// Commit commits the held write; its caller then gets its answer.
func (h *Hold) Commit() { h.once.Do(func() { close(h.commit) }) }

// HoldNextWrite holds the next write that passes validation in flight until Commit
// (or until Close, which commits every held write so no goroutine stays blocked; a
// write prepared after Close is not held).
func (s *Sim) HoldNextWrite() *Hold {
	h := newHold()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holds = append(s.holds, h)
	return h
}

// Settled returns a channel that is closed once no write is in flight: every write
// prepared so far (kept in flight by Options.CommitDelay or HoldNextWrite) has
// committed. A test's backoff can wait on it instead of sleeping: on a server, a
// backoff longer than the fsync window lets a re-read see the write that caused a 2003.
func (s *Sim) Settled() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settled
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
