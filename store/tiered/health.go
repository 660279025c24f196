package tiered

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/idemkey/idemkey/store"
)

var _ store.Pinger = (*Store)(nil)

// health is the fast path's outage state: down from an outage's first cache
// error to the next cache call that succeeds.
type health struct {
	logger  *slog.Logger // nil: slog.Default()
	down    atomic.Bool
	outages atomic.Int64
}

// WithLogger sets the logger of the fast path's outage lines (default
// slog.Default()): one warning when Redis starts failing ("tiered: redis fast path
// down, serving from the backstop alone", with the operation and the error) and
// one info line when a Redis call succeeds again ("tiered: redis fast path
// recovered"), however many requests meet the outage in between.
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.health.logger = l } }

func (s *Store) log() *slog.Logger {
	if s.health.logger != nil {
		return s.health.logger
	}
	return slog.Default()
}

// outage records a cache error that means the cache is down or hung; the first one of
// an outage is logged.
func (s *Store) outage(op Op, err error) {
	if s.health.down.Load() || !s.health.down.CompareAndSwap(false, true) {
		return
	}
	s.health.outages.Add(1)
	s.log().Warn("tiered: redis fast path down, serving from the backstop alone", "op", op, "err", err)
}

// recovered records a cache call that succeeded; the first one after an outage is
// logged. One atomic load when the fast path is up.
func (s *Store) recovered() {
	if !s.health.down.Load() || !s.health.down.CompareAndSwap(true, false) {
		return
	}
	s.log().Info("tiered: redis fast path recovered")
}

// Ping implements store.Pinger: the backstop decides readiness, the cache only
// degrades it. It pings the backstop (when it implements store.Pinger) and
// returns its error, wrapped, if it fails: the store cannot answer. Then it pings
// the cache (when it implements store.Pinger, as *redis.Store does), even while
// cooling down, within ctx's deadline rather than the fast path's timeout (a
// readiness probe is not a request's latency; give ctx a deadline): on failure it
// returns an error wrapping store.ErrDegraded, counted and logged like any
// fast-path error (OpPing), so a probe sees an outage even without traffic; on
// success an outage ends. A cache without Ping reports the state its last call
// left (Stats.Degraded). A ctx cancelled by the caller is returned as such.
func (s *Store) Ping(ctx context.Context) error {
	if err := store.Ping(ctx, s.backstop); err != nil {
		return fmt.Errorf("idemkey/store/tiered: backstop: %w", err)
	}
	p, ok := s.fast.(store.Pinger)
	if !ok {
		if s.health.down.Load() {
			return fmt.Errorf("%w: tiered: redis fast path down", store.ErrDegraded)
		}
		return nil
	}
	err := p.Ping(ctx)
	switch {
	case err == nil:
		s.recovered()
		return nil
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("idemkey/store/tiered: ping: %w", ctx.Err())
	}
	s.event(OpPing, FastError, err)
	return fmt.Errorf("%w: tiered: redis fast path: %w", store.ErrDegraded, err)
}
