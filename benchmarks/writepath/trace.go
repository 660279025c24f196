package main

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// counts are what pgx sent for one request: round trips, statements, and
// commits (explicit COMMITs, plus each round trip that ran outside a
// transaction block and so committed on its own, unless it was only plain
// SELECTs: a read, such as WithReadFirst's, writes no WAL and has nothing to
// flush, while a SELECT around a data-modifying WITH starts with WITH).
type counts struct {
	trips, statements, commits atomic.Int64
}

type countsKey struct{}

func withCounts(ctx context.Context, c *counts) context.Context {
	return context.WithValue(ctx, countsKey{}, c)
}

// tracer attributes every statement to the request whose context carries its
// counts (the middleware's and the store's calls run on contexts derived from
// it); statements without one (the background ROLLBACK after a one-transaction
// replay) are not counted.
type tracer struct{}

func countsOf(ctx context.Context) *counts {
	c, _ := ctx.Value(countsKey{}).(*counts)
	return c
}

func (tracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if c := countsOf(ctx); c != nil {
		c.trips.Add(1)
		c.statements.Add(1)
		if conn.PgConn().TxStatus() == 'I' && !isBegin(d.SQL) && !isSelect(d.SQL) || isCommit(d.SQL) {
			c.commits.Add(1)
		}
	}
	return ctx
}

func (tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if c := countsOf(ctx); c != nil {
		c.trips.Add(1)
		qs := d.Batch.QueuedQueries
		if conn.PgConn().TxStatus() == 'I' && (len(qs) == 0 || !isBegin(qs[0].SQL)) && !allSelects(qs) {
			c.commits.Add(1)
		}
	}
	return ctx
}

func (tracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if c := countsOf(ctx); c != nil {
		c.statements.Add(1)
		if isCommit(d.SQL) {
			c.commits.Add(1)
		}
	}
}

func (tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func isBegin(sql string) bool {
	return len(sql) >= 5 && strings.EqualFold(sql[:5], "begin")
}

func isCommit(sql string) bool { return strings.EqualFold(strings.TrimSpace(sql), "commit") }

func isSelect(sql string) bool {
	sql = strings.TrimSpace(sql)
	return len(sql) >= 6 && strings.EqualFold(sql[:6], "select")
}

// allSelects reports whether a batch holds only plain SELECTs (none: false).
func allSelects(qs []*pgx.QueuedQuery) bool {
	for _, q := range qs {
		if !isSelect(q.SQL) {
			return false
		}
	}
	return len(qs) > 0
}
