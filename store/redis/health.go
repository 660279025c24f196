package redis

import (
	"context"
	"fmt"

	"github.com/idemkey/idemkey/store"
)

var _ store.Pinger = (*Store)(nil)

// Ping implements store.Pinger: one PING through the client (on a Cluster
// client, to the one node go-redis picks for a keyless command). Errors are the
// client's, wrapped; store.ErrInvalid for a nil client.
func (s *Store) Ping(ctx context.Context) error {
	if s.client == nil {
		return fmt.Errorf("idemkey/store/redis: %w: nil client", store.ErrInvalid)
	}
	if err := s.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("idemkey/store/redis: ping: %w", err)
	}
	return nil
}
