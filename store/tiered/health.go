package tiered

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/store"
)

var _ store.Pinger = (*Store)(nil)

// health is the fast path's outage state: down (Stats.Degraded, counted in
// Stats.Outages) from an outage's first cache error to the next cache call that
// succeeds; its log lines follow the same rule as the middleware's store outage
// lines (store.OutageLog): a start, a summary every minute while it lasts, and an
// end only once the cache has gone store.OutageQuiet without an error, so a
// flapping cache is one outage in the log.
type health struct {
	logger  *slog.Logger // nil: slog.Default()
	down    atomic.Bool
	outages atomic.Int64
	log     store.OutageLog
	now     func() time.Time // nil: time.Now (tests set it)
}

// WithLogger sets the logger of the fast path's outage lines (default
// slog.Default()): one warning when Redis starts failing ("tiered: redis fast path
// down, serving from the backstop alone", with the operation and the error), a
// warning with the counts every minute while it goes on, and one info line when
// a Redis call succeeds store.OutageQuiet (5 s) or more after the last error
// ("tiered: redis fast path recovered", with the errors counted and the outage's
// length), however many requests meet the outage in between.
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.health.logger = l } }

func (s *Store) log() *slog.Logger {
	if s.health.logger != nil {
		return s.health.logger
	}
	return slog.Default()
}

func (s *Store) now() time.Time {
	if s.health.now != nil {
		return s.health.now()
	}
	return time.Now()
}

// outage records a cache error that means the cache is down or hung: the first
// one of a run counts an outage; the log follows store.OutageLog.
func (s *Store) outage(op Op, err error) {
	if !s.health.down.Load() && s.health.down.CompareAndSwap(false, true) {
		s.health.outages.Add(1)
	}
	switch l := s.health.log.Failed(s.now()); {
	case l.Start:
		s.log().Warn("tiered: redis fast path down, serving from the backstop alone", "op", op, "err", err)
	case l.Summary:
		s.log().Warn("tiered: redis fast path still down, serving from the backstop alone",
			"op", op, "errors", l.Failures, "for", l.For, "err", err)
	}
}

// recovered records a cache call that succeeded: the fast path is up again, and
// the outage's end is logged once the cache has gone store.OutageQuiet without
// an error. Two atomic loads when the fast path is up.
func (s *Store) recovered() {
	if s.health.down.Load() {
		s.health.down.Store(false)
	}
	if !s.health.log.Down() {
		return
	}
	if l := s.health.log.Succeeded(s.now()); l.End {
		s.log().Info("tiered: redis fast path recovered", "errors", l.Failures, "outage", l.For)
	}
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
			return fmt.Errorf("idemkey/store/tiered: %w: redis fast path down", store.ErrDegraded)
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
	return fmt.Errorf("idemkey/store/tiered: %w: redis fast path: %w", store.ErrDegraded, err)
}
