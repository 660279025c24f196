package postgres

import (
	"context"
	"fmt"

	"github.com/idemkey/idemkey/store"
)

var _ store.Pinger = (*Store)(nil)

// Stats are the store's own counters since New.
type Stats struct {
	// ClaimRetries counts claim statements re-run because a concurrent claim of
	// the same key committed after the statement's snapshot, the READ COMMITTED
	// hazard of docs/architecture.md section 4. A steady rate means many clients
	// race on the same keys; each retry is one more round trip.
	ClaimRetries int64
	// Waiters is the number of Wait calls in progress (duplicates waiting for a
	// claim in flight), and Listening whether their LISTEN connection is open.
	Waiters   int64
	Listening bool
	// Polling is set when Wait polls instead of listening (WithPolledWait,
	// WithTransactionPooler), and PoolerExecMode when every statement is sent
	// with the forced exec mode (WithQueryExecMode, WithTransactionPooler).
	Polling, PoolerExecMode bool
}

// Stats returns the counters. It is safe to call concurrently with every other
// method and does no I/O.
func (s *Store) Stats() Stats {
	waiters, listening := s.waiters.Stats()
	return Stats{ClaimRetries: s.claimRetries.Load(), Waiters: int64(waiters), Listening: listening,
		Polling: s.polling, PoolerExecMode: s.forceMode}
}

// Ping implements store.Pinger: one round trip to the database, through the
// querier's own Ping when it has one (*pgxpool.Pool, *pgx.Conn), else a
// `SELECT 1`. It reads no table, so it does not check that Migrate ran. Errors
// are the driver's, wrapped.
func (s *Store) Ping(ctx context.Context) error {
	var err error
	if p, ok := s.db.(store.Pinger); ok {
		err = p.Ping(ctx)
	} else {
		_, err = s.db.Exec(ctx, "SELECT 1")
	}
	if err != nil {
		return fmt.Errorf("idemkey/store/postgres: ping: %w", err)
	}
	return nil
}
