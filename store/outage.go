package store

import (
	"sync"
	"sync/atomic"
	"time"
)

// The outage log's rule (OutageLog), the same for the middleware's store and the
// tiered store's cache.
const (
	// OutageQuiet is how long a store must go without a failure for a success to
	// end an outage: a store that fails every other call (a flapping connection,
	// an exhausted pool) is one outage, not a start and an end line per failure.
	OutageQuiet = 5 * time.Second
	// OutageSummaryEvery is how often an outage that goes on is logged again, with
	// the counts so far.
	OutageSummaryEvery = time.Minute
)

// OutageLog decides when a run of failures of a store (or of a cache in front of
// one) is logged: once when it starts, with a summary at most every
// OutageSummaryEvery while it lasts, and once when it ends, at the first success
// OutageQuiet or more after the last failure. It logs nothing itself: its
// callers word their lines. The zero value is ready; safe for concurrent use;
// Down and Succeeded cost one atomic load while the store is up.
type OutageLog struct {
	down atomic.Bool

	mu       sync.Mutex
	since    time.Time // first failure of the run
	last     time.Time // latest failure of the run
	lastLog  time.Time
	failures int64 // failures during the run
}

// OutageLine is what an OutageLog call asks its caller to log, if anything.
type OutageLine struct {
	// Start: the outage starts (Failed); Summary: it goes on and a summary is due
	// (Failed); End: it ended (Succeeded). At most one is set; none: log nothing.
	Start, Summary, End bool
	// Failures is the number of failures of the outage so far (all of it on End).
	Failures int64
	// For is how long the outage has lasted: from its first failure to now (on
	// End, to the success that ended it).
	For time.Duration
}

// Failed records a failure at now.
func (o *OutageLog) Failed(now time.Time) OutageLine {
	o.mu.Lock()
	defer o.mu.Unlock()
	var l OutageLine
	if !o.down.Load() {
		o.down.Store(true)
		o.since, o.lastLog, o.failures = now, now, 0
		l.Start = true
	} else if now.Sub(o.lastLog) >= OutageSummaryEvery {
		o.lastLog = now
		l.Summary = true
	}
	o.failures++
	o.last = now
	l.Failures, l.For = o.failures, now.Sub(o.since)
	return l
}

// Down reports whether an outage is on (one atomic load): callers on a hot path
// check it before reading the clock for Succeeded.
func (o *OutageLog) Down() bool { return o.down.Load() }

// Succeeded records a success at now: it ends the outage (End) if one is on and
// nothing failed for OutageQuiet.
func (o *OutageLog) Succeeded(now time.Time) OutageLine {
	if !o.down.Load() {
		return OutageLine{}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.down.Load() || now.Sub(o.last) < OutageQuiet {
		return OutageLine{}
	}
	o.down.Store(false)
	return OutageLine{End: true, Failures: o.failures, For: now.Sub(o.since)}
}
