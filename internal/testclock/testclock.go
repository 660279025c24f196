// Package testclock provides a manual clock for tests: time stands still until
// the test moves it with Add. Stores, the middleware and the Celeriant simulator
// take a func() time.Time, so tests pass (*Clock).Now and call Add where they
// would otherwise sleep.
package testclock

import (
	"sync"
	"time"
)

// Clock is a manually advanced clock. The zero value reads the zero time.Time.
// It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a clock that reads start until Add moves it.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Add moves the clock by d; a negative d moves it back.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
