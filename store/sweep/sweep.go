// Package sweep runs a store's deletion of expired records in the background,
// for the SQL stores' StartSweeper (store/postgres, store/mysql): one goroutine,
// one call per interval, failures logged and retried at the next tick.
package sweep

import (
	"context"
	"log/slog"
	"time"
)

// DefaultInterval is the interval of Start when it is given none.
const DefaultInterval = time.Minute

// Start calls sweep every interval (DefaultInterval if interval <= 0) in a
// goroutine until ctx is done or stop is called; stop waits for the goroutine to
// end and may be called more than once. A failed sweep (unless ctx ended) is
// logged at Warn as "<name>: sweep failed", a sweep that deleted rows at Debug as
// "<name>: swept expired records", both with attrs and the count; logger nil
// means slog.Default().
func Start(ctx context.Context, interval time.Duration, sweep func(ctx context.Context) (int64, error),
	logger *slog.Logger, name string, attrs ...any) (stop func()) {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if logger == nil {
		logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			n, err := sweep(ctx)
			args := append(append([]any(nil), attrs...), "deleted", n)
			switch {
			case err != nil && ctx.Err() == nil:
				logger.WarnContext(ctx, name+": sweep failed", append(args, "err", err)...)
			case n > 0:
				logger.DebugContext(ctx, name+": swept expired records", args...)
			}
		}
	}()
	return func() { cancel(); <-done }
}
