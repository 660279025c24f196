package middleware

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// outageSummaryEvery is how often a store outage that goes on is logged again,
// with the counts so far.
const outageSummaryEvery = time.Minute

// outageQuiet is how long the store must go without a failure for an answered
// claim to end the outage: a store that fails every other request (a flapping
// connection, an exhausted pool) is one outage, not a start and an end line per
// failure.
const outageQuiet = 5 * time.Second

// outage tracks a run of store failures so that it is logged once, when it
// starts, with counts while it lasts (at most every outageSummaryEvery) and when
// the store answers again, instead of once per refused request (those are logged
// at debug level). The healthy path costs one atomic load.
type outage struct {
	down atomic.Bool

	mu       sync.Mutex
	since    time.Time // first failure of the run
	last     time.Time // latest failure of the run
	lastLog  time.Time
	failures int64 // requests the store failed during the run
}

// storeFailed records a store failure of a request and logs the outage's start, or a
// summary once per outageSummaryEvery; failOpen says what the requests got. A
// claim that failed because the request's context was cancelled (the client went
// away) says nothing about the store and is not counted. A deadline is counted:
// a store that hangs past every request's deadline is down.
func (m *Middleware) storeFailed(ctx context.Context, err error) {
	if errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	o := &m.outage
	now := m.clockNow()
	o.mu.Lock()
	start := !o.down.Load()
	if start {
		o.down.Store(true)
		o.since, o.lastLog, o.failures = now, now, 0
	}
	o.failures++
	o.last = now
	n, since := o.failures, o.since
	summary := !start && now.Sub(o.lastLog) >= outageSummaryEvery
	if summary {
		o.lastLog = now
	}
	o.mu.Unlock()

	answer := "answering 503 (fail closed)"
	level := slog.LevelError
	if m.failOpen {
		answer, level = "running handlers unprotected (fail open)", slog.LevelWarn
	}
	switch {
	case start:
		m.logger.LogAttrs(ctx, level, "idempotency store unavailable; "+answer+" until it answers again",
			slog.Any("error", err))
	case summary:
		m.logger.LogAttrs(ctx, level, "idempotency store still unavailable; "+answer,
			slog.Int64("failed_requests", n), slog.Duration("for", now.Sub(since)), slog.Any("error", err))
	}
}

// storeAnswered ends an outage, if one is on and the store has not failed for
// outageQuiet, with a line that counts it.
func (m *Middleware) storeAnswered(ctx context.Context) {
	o := &m.outage
	if !o.down.Load() {
		return
	}
	now := m.clockNow()
	o.mu.Lock()
	if !o.down.Load() || now.Sub(o.last) < outageQuiet {
		o.mu.Unlock()
		return
	}
	o.down.Store(false)
	n, d := o.failures, now.Sub(o.since) // to the answer that ends it: a lone failure is no 0 s outage
	o.mu.Unlock()
	m.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency store available again",
		slog.Int64("failed_requests", n), slog.Duration("outage", d))
}
