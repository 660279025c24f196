package mysql

import (
	"context"
	"fmt"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/waitset"
)

// Wait implements store.Waiter by polling: MySQL and MariaDB have no
// notifications, so Wait reads whether id holds a live claim (one plain SELECT
// on the primary key, no lock) at once and then with back-off (WithPollInterval:
// 5 ms doubling to 250 ms by default, through waitset.Poll) until it does not
// (nil: completed, released, evicted, or its lease ran out) or ctx ends
// (ctx.Err()). A duplicate therefore learns of the end within the current
// back-off step. Errors: store.ErrInvalid for an invalid ID, ctx.Err(), the
// driver's errors wrapped.
func (s *Store) Wait(ctx context.Context, id store.ID) error {
	if err := id.Validate(); err != nil {
		return err
	}
	st, err := s.stmts.get(ctx, s.sqlOf.live)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("idemkey/store/mysql: wait: %w", err)
	}
	scope, key := bytesOf(id.Scope), bytesOf(id.Key)
	return waitset.Poll(ctx, s.pollFirst, s.pollMax, func(ctx context.Context) (bool, error) {
		var n int
		if err := st.QueryRowContext(ctx, scope, key).Scan(&n); err != nil {
			return false, fmt.Errorf("idemkey/store/mysql: wait: %w", err)
		}
		return n > 0, nil
	})
}
