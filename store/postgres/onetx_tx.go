package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrTxOwned is returned by Commit and Rollback of the transaction of a
// one-transaction route (TxFromContext): the middleware commits it with the
// record once the handler returned, or rolls it back when the handler answers
// 5xx.
var ErrTxOwned = errors.New("idemkey/postgres: the idempotency middleware commits or rolls back this transaction")

// claimTx is the handler's pgx.Tx on a one-transaction route: the transaction
// begun with the claim, usable while the request's slot holds it, whose Commit
// and Rollback are the middleware's.
type claimTx struct {
	pgx.Tx
	slot *txSlot
}

// live reports whether the transaction is still the handler's.
func (t *claimTx) live() bool {
	t.slot.mu.Lock()
	defer t.slot.mu.Unlock()
	return t.slot.tx == t
}

// Commit returns ErrTxOwned.
func (t *claimTx) Commit(context.Context) error { return ErrTxOwned }

// Rollback returns ErrTxOwned.
func (t *claimTx) Rollback(context.Context) error { return ErrTxOwned }

func (t *claimTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if !t.live() {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Begin(ctx)
}

func (t *claimTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if !t.live() {
		return 0, pgx.ErrTxClosed
	}
	return t.Tx.CopyFrom(ctx, table, cols, src)
}

func (t *claimTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if !t.live() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return t.Tx.SendBatch(ctx, b)
}

func (t *claimTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if !t.live() {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *claimTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !t.live() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *claimTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !t.live() {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Query(ctx, sql, args...)
}

func (t *claimTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if !t.live() {
		return closedRow{}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

// closedRow answers pgx.ErrTxClosed.
type closedRow struct{}

func (closedRow) Scan(...any) error { return pgx.ErrTxClosed }
