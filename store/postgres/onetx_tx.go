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

// use holds the transaction for one call of the handler's: ok false when it is
// no longer live (nothing held); otherwise done must be called once the call
// returned. The slot's take waits for it, so a statement that passed the check
// runs in the transaction, never on the connection after its commit (a
// goroutine of the handler still running when the middleware completes).
func (t *claimTx) use() (done func(), ok bool) {
	t.slot.use.Lock()
	if !t.live() {
		t.slot.use.Unlock()
		return nil, false
	}
	return t.slot.use.Unlock, true
}

// Commit returns ErrTxOwned; on a savepoint it releases it (pgx.ErrTxClosed
// once the request's transaction has ended).
func (t *claimTx) Commit(ctx context.Context) error { return t.end(ctx, t.Tx.Commit) }

// Rollback returns ErrTxOwned; on a savepoint it rolls back to it
// (pgx.ErrTxClosed once the request's transaction has ended).
func (t *claimTx) Rollback(ctx context.Context) error { return t.end(ctx, t.Tx.Rollback) }

// end runs a savepoint's Commit or Rollback f while the transaction is live.
func (t *claimTx) end(ctx context.Context, f func(context.Context) error) error {
	if t.root == nil {
		return ErrTxOwned
	}
	done, ok := t.use()
	if !ok {
		return pgx.ErrTxClosed
	}
	defer done()
	return f(ctx)
}

// Begin opens a savepoint, which refuses use once the request's transaction
// has ended, as the transaction does (pgx's own savepoint would run its
// statements on the connection the transaction committed on).
func (t *claimTx) Begin(ctx context.Context) (pgx.Tx, error) {
	done, ok := t.use()
	if !ok {
		return nil, pgx.ErrTxClosed
	}
	defer done()
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
	done, ok := t.use()
	if !ok {
		return 0, pgx.ErrTxClosed
	}
	defer done()
	return t.Tx.CopyFrom(ctx, table, cols, src)
}

func (t *claimTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	done, ok := t.use()
	if !ok {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	defer done()
	return t.Tx.SendBatch(ctx, b)
}

func (t *claimTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	done, ok := t.use()
	if !ok {
		return nil, pgx.ErrTxClosed
	}
	defer done()
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *claimTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	done, ok := t.use()
	if !ok {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	defer done()
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *claimTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	done, ok := t.use()
	if !ok {
		return nil, pgx.ErrTxClosed
	}
	defer done()
	return t.Tx.Query(ctx, sql, args...)
}

// QueryRow holds the transaction until the row is scanned, so the completion
// waits for it (the row's result is still on the connection until then).
func (t *claimTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	done, ok := t.use()
	if !ok {
		return closedRow{}
	}
	return heldRow{row: t.Tx.QueryRow(ctx, sql, args...), done: done}
}

// heldRow is a row of the transaction, which it holds until Scan.
type heldRow struct {
	row  pgx.Row
	done func()
}

func (r heldRow) Scan(dest ...any) error {
	defer r.done()
	return r.row.Scan(dest...)
}

// closedRow answers pgx.ErrTxClosed.
type closedRow struct{}

func (closedRow) Scan(...any) error { return pgx.ErrTxClosed }
