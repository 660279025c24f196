package middleware

import (
	"hash/maphash"
	"sync/atomic"
	"time"
)

// workSlots is the number of per-route handler duration estimates a Middleware
// keeps; routes beyond it share slots (an estimate, never a correctness matter).
const workSlots = 64

// workEstimate keeps a moving average of recent handler durations, per route
// (hashed into workSlots slots) and over all routes, to answer a 409's
// Retry-After with the work a request of that route typically still needs
// instead of the holder's whole remaining lease. A duration runs from the
// claim's send (on the middleware's own clock) to the handler's return, so it
// includes the store's answer to the claim. Lock-free; no allocation.
type workEstimate struct {
	seed  maphash.Seed
	all   atomic.Int64 // ns; 0 = no sample yet
	slots [workSlots]atomic.Int64
}

func newWorkEstimate() *workEstimate { return &workEstimate{seed: maphash.MakeSeed()} }

func (w *workEstimate) slot(route string) *atomic.Int64 {
	return &w.slots[maphash.String(w.seed, route)%workSlots]
}

// observe adds one handler duration for route: an exponentially weighted moving
// average with weight 1/4 for the new sample.
func (w *workEstimate) observe(route string, d time.Duration) {
	ns := max(int64(d), 1)
	for _, a := range [2]*atomic.Int64{w.slot(route), &w.all} {
		for {
			old := a.Load()
			next := ns
			if old != 0 {
				next = max(old+(ns-old)/4, 1)
			}
			if a.CompareAndSwap(old, next) {
				break
			}
		}
	}
}

// estimate returns the expected handler duration for route: the route's
// average, else the average over all routes, else 0 (no sample yet).
func (w *workEstimate) estimate(route string) time.Duration {
	if ns := w.slot(route).Load(); ns != 0 {
		return time.Duration(ns)
	}
	return time.Duration(w.all.Load())
}

// inFlightRetryAfter is the Retry-After of a 409 for route while the holder has
// rest of its lease left: the expected handler duration rounded up to whole
// seconds, at least 1 s and at most rest rounded down (a client that honours it
// never waits past the lease). With no sample yet it is rest.
func (m *Middleware) inFlightRetryAfter(route string, rest time.Duration) time.Duration {
	limit := max(rest/time.Second, 1) * time.Second
	est := m.work.estimate(route)
	if est <= 0 {
		return limit
	}
	secs := (est + time.Second - 1) / time.Second * time.Second
	return min(max(secs, time.Second), limit)
}
