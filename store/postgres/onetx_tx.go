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
// and Rollback are the middleware's; or a savepoint in it (root set), usable as
// long as the transaction, whose Commit and Rollback are its own.
type claimTx struct {
	pgx.Tx
	slot *txSlot
	root *claimTx // the request's transaction, for a savepoint; nil for it
}

// live reports whether the transaction is still the handler's, and still open:
// a handler that ended it with SQL of its own (COMMIT, ROLLBACK) would
// otherwise go on in autocommit, each statement committing outside the record.
func (t *claimTx) live() bool {
	root := t
	if t.root != nil {
		root = t.root
	}
	t.slot.mu.Lock()
	defer t.slot.mu.Unlock()
	return t.slot.tx == root && t.slot.conn.Conn().PgConn().TxStatus() != 'I'
}

// Commit returns ErrTxOwned; on a savepoint it releases it (pgx.ErrTxClosed
// once the request's transaction has ended).
func (t *claimTx) Commit(ctx context.Context) error { return t.end(ctx, t.Tx.Commit) }

// Rollback returns ErrTxOwned; on a savepoint it rolls back to it
// (pgx.ErrTxClosed once the request's transaction has ended).
func (t *claimTx) Rollback(ctx context.Context) error { return t.end(ctx, t.Tx.Rollback) }

// end runs a savepoint's Commit or Rollback f while the transaction is live.
func (t *claimTx) end(ctx context.Context, f func(context.Context) error) error {
	switch {
	case t.root == nil:
		return ErrTxOwned
	case !t.live():
		return pgx.ErrTxClosed
	}
	return f(ctx)
}

// Begin opens a savepoint, which refuses use once the request's transaction
// has ended, as the transaction does (pgx's own savepoint would run its
// statements on the connection the transaction committed on).
func (t *claimTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if !t.live() {
		return nil, pgx.ErrTxClosed
	}
	sp, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	root := t.root
	if root == nil {
		root = t
	}
	return &claimTx{Tx: sp, slot: t.slot, root: root}, nil
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
