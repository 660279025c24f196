// Package sleep waits for a duration or the end of a context, for the client's and the
// simulator's backoffs and delays.
package sleep

import (
	"context"
	"time"
)

// Ctx waits d and returns nil, or ctx.Err() if ctx ends first; d <= 0 returns nil at
// once.
func Ctx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
