package middleware

import (
	"context"
	"errors"
	"log/slog"

	"github.com/idemkey/idemkey/store"
)

// outageQuiet is how long the store must go without a failure for an answered
// claim to end the outage (store.OutageLog, the rule the tiered store's cache
// lines follow too).
const outageQuiet = store.OutageQuiet

// storeFailed records a store failure of a request and logs the outage's start, or a
// summary once per store.OutageSummaryEvery (m.outage, a store.OutageLog: one line
// per outage instead of one per refused request, those are logged at debug
// level); failOpen says what the requests got. A claim that failed because the
// request's context was cancelled (the client went away) says nothing about the
// store and is not counted. A deadline is counted: a store that hangs past every
// request's deadline is down.
func (m *Middleware) storeFailed(ctx context.Context, err error) {
	if errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	l := m.outage.Failed(m.clockNow())
	answer := "answering 503 (fail closed)"
	level := slog.LevelError
	if m.failOpen {
		answer, level = "running handlers unprotected (fail open)", slog.LevelWarn
	}
	switch {
	case l.Start:
		m.logger.LogAttrs(ctx, level, "idempotency store call failed; "+answer+" until it answers again",
			slog.Any("error", err))
	case l.Summary:
		m.logger.LogAttrs(ctx, level, "idempotency store calls still failing; "+answer,
			slog.Int64("failed_requests", l.Failures), slog.Duration("for", l.For), slog.Any("error", err))
	}
}

// storeAnswered ends an outage, if one is on and the store has not failed for
// outageQuiet, with a line that counts it; its length runs from the first failure
// to this answer.
func (m *Middleware) storeAnswered(ctx context.Context) {
	if !m.outage.Down() { // the healthy path: no clock read
		return
	}
	if l := m.outage.Succeeded(m.clockNow()); l.End {
		m.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency store available again",
			slog.Int64("failed_requests", l.Failures), slog.Duration("outage", l.For))
	}
}
