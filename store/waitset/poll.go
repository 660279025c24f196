package waitset

import (
	"context"
	"time"
)

// Default back-off of Poll: the first re-check after DefaultPollFirst, each next
// one twice as late, at most DefaultPollMax apart.
const (
	DefaultPollFirst = 5 * time.Millisecond
	DefaultPollMax   = 250 * time.Millisecond
)

// Poll is the store.Waiter of a store without notifications (store/mysql, or
// store/postgres behind a transaction-pooling proxy, where LISTEN cannot work):
// it calls check (the store's one-statement look at the key) at once and then
// with back-off, first after first, doubling up to limit, until check reports no
// live claim (nil) or ctx ends (ctx.Err()). A check error is returned as it is,
// unless ctx ended meanwhile. first and limit of 0 or less take the defaults; a
// limit below first is raised to first. Poll holds nothing once it returns: one
// timer per call, stopped.
func Poll(ctx context.Context, first, limit time.Duration, check func(ctx context.Context) (live bool, err error)) error {
	if first <= 0 {
		first = DefaultPollFirst
	}
	if limit <= 0 {
		limit = DefaultPollMax
	}
	limit = max(limit, first)
	delay := first
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		live, err := check(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			return err
		case !live:
			return nil
		}
		if timer == nil {
			timer = time.NewTimer(delay)
		} else {
			timer.Reset(delay)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		delay = min(2*delay, limit)
	}
}
