package mysql

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkey/idemkey/store/sweep"
)

// Sweep deletes records past their retention, at most limit of them (limit <= 0:
// all), in statements of at most the sweep batch size (WithSweepBatch), each its
// own short transaction through the expiry index. It returns how many rows it
// deleted. Claim already treats expired records as absent, so sweeping only
// reclaims space; run it from a cron job or StartSweeper. A row locked by an open
// transaction (a handler's CompleteTx) makes the batch wait for it, up to the
// server's innodb_lock_wait_timeout. On a driver error it returns the rows
// deleted so far and the error, wrapped.
func (s *Store) Sweep(ctx context.Context, limit int) (int64, error) {
	var total int64
	st, err := s.stmts.get(ctx, s.sqlOf.sweep)
	if err != nil {
		return 0, fmt.Errorf("idemkey/store/mysql: sweep: %w", err)
	}
	for limit <= 0 || total < int64(limit) {
		n := int64(s.sweepBatch)
		if limit > 0 {
			n = min(n, int64(limit)-total)
		}
		res, err := st.ExecContext(ctx, n)
		if err != nil {
			return total, fmt.Errorf("idemkey/store/mysql: sweep: %w", err)
		}
		got, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("idemkey/store/mysql: sweep: %w", err)
		}
		total += got
		if got < n {
			break
		}
	}
	return total, nil
}

// StartSweeper runs Sweep(ctx, 0) every interval (1 minute if interval <= 0) in a
// goroutine until ctx is done or stop is called; stop waits for the goroutine to
// end. Failures are logged (WithLogger) and retried at the next tick.
func (s *Store) StartSweeper(ctx context.Context, interval time.Duration) (stop func()) {
	return sweep.Start(ctx, interval, func(ctx context.Context) (int64, error) { return s.Sweep(ctx, 0) },
		s.log(), "idemkey/mysql", "table", s.quoted)
}
