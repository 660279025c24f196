package memory

import (
	"context"

	"github.com/idemkey/idemkey/store"
)

var _ store.Pinger = (*Store)(nil)

// Ping implements store.Pinger: the store lives in the process, so it is always
// ready and answers nil, unless ctx is already done (its error).
func (s *Store) Ping(ctx context.Context) error { return ctx.Err() }
