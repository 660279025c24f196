package mysql

import (
	"context"
	"fmt"
)

// Stats are the store's own counters since New.
type Stats struct {
	// ClaimRetries counts claim reads re-run because a concurrent claim of the
	// same key won after Claim's read, or InnoDB rolled the claim's INSERT back
	// as a deadlock victim. A steady rate means many clients race on the same
	// keys; each retry is two more round trips.
	ClaimRetries int64
}

// Stats returns the counters. It is safe to call concurrently with every other
// method and does no I/O.
func (s *Store) Stats() Stats { return Stats{ClaimRetries: s.claimRetries.Load()} }

// Ping implements store.Pinger: one round trip to the server (sql.DB.PingContext).
// It reads no table, so it does not check that Migrate ran. Errors are the
// driver's, wrapped.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("idemkey/store/mysql: ping: %w", err)
	}
	return nil
}
