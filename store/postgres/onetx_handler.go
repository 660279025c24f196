package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkey/idemkey/store/postgres/internal/sqltext"
)

// claimTx is the handler's pgx.Tx (TxFromContext): the claim's transaction, or
// a savepoint in it (root set). Each call runs while the transaction is the
// handler's (the library has not taken it back), under the statement timeout,
// and refuses SQL that would end it (sqltext.EndsTx).
type claimTx struct {
	pgx.Tx
	c    *txClaim
	root bool // a savepoint: its Commit and Rollback are its own
}

// use holds the transaction for one call, with ctx bounded by the statement
// timeout: done ends the hold and the bound (split: release then cancel). An
// error, and nothing held, once the library took the transaction back
// (pgx.ErrTxClosed) or when sql would end it (ErrTxOwned).
func (t *claimTx) use(ctx context.Context, sql string) (_ context.Context, done func(), err error) {
	ctx, release, cancel, err := t.hold(ctx, sql)
	if err != nil {
		return nil, nil, err
	}
	return ctx, func() { release(); cancel() }, nil
}

func (t *claimTx) hold(ctx context.Context, sql string) (_ context.Context, release, cancel func(), err error) {
	if sqltext.EndsTx(sql) {
		return nil, nil, nil, ErrTxOwned
	}
	t.c.use <- struct{}{}
	release = func() { <-t.c.use }
	t.c.mu.Lock()
	closed := t.c.closed
	t.c.mu.Unlock()
	if closed || t.c.conn.Conn().PgConn().TxStatus() == 'I' {
		release()
		return nil, nil, nil, pgx.ErrTxClosed
	}
	ctx, cancel = context.WithTimeout(ctx, t.c.t.stmtTimeout)
	return ctx, release, cancel, nil
}

func (t *claimTx) Commit(ctx context.Context) error   { return t.end(ctx, t.Tx.Commit) }
func (t *claimTx) Rollback(ctx context.Context) error { return t.end(ctx, t.Tx.Rollback) }

// end is a savepoint's Commit or Rollback f; the transaction's own are ErrTxOwned.
func (t *claimTx) end(ctx context.Context, f func(context.Context) error) error {
	if !t.root {
		return ErrTxOwned
	}
	ctx, done, err := t.use(ctx, "")
	if err != nil {
		return err
	}
	defer done()
	return f(ctx)
}

// Begin opens a savepoint, which refuses use once the transaction was taken
// back, as the transaction does.
func (t *claimTx) Begin(ctx context.Context) (pgx.Tx, error) {
	ctx, done, err := t.use(ctx, "")
	if err != nil {
		return nil, err
	}
	defer done()
	sp, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &claimTx{Tx: sp, c: t.c, root: true}, nil
}

// Conn and LargeObjects are side doors: what the handler does through them is
// not watched, so the commit trusts only its fence (Commit, failClosed).
func (t *claimTx) Conn() *pgx.Conn {
	t.c.mu.Lock()
	t.c.sideDoor = true
	t.c.mu.Unlock()
	return t.Tx.Conn()
}

func (t *claimTx) LargeObjects() pgx.LargeObjects { t.Conn(); return t.Tx.LargeObjects() }

func (t *claimTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	ctx, done, err := t.use(ctx, "")
	if err != nil {
		return 0, err
	}
	defer done()
	return t.Tx.CopyFrom(ctx, table, cols, src)
}

func (t *claimTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if sqltext.EndsTx(q.SQL) {
			return pgx.FailedBatchResults(b, ErrTxOwned)
		}
	}
	ctx, release, cancel, err := t.hold(ctx, "")
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	defer release()
	return heldBatch{BatchResults: t.Tx.SendBatch(ctx, b), cancel: cancel}
}

func (t *claimTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	ctx, done, err := t.use(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer done()
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *claimTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	ctx, done, err := t.use(ctx, sql)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer done()
	return t.Tx.Exec(ctx, sql, args...)
}

// Query's Rows stay bounded by the statement timeout until closed.
func (t *claimTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	ctx, release, cancel, err := t.hold(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := t.Tx.Query(ctx, sql, args...)
	if err != nil {
		cancel()
		return nil, err
	}
	return &heldRows{Rows: rows, cancel: cancel}, nil
}

// QueryRow holds the transaction until the row is scanned.
func (t *claimTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	ctx, done, err := t.use(ctx, sql)
	if err != nil {
		return errRow{err}
	}
	return heldRow{row: t.Tx.QueryRow(ctx, sql, args...), done: done}
}

type heldRow struct {
	row  pgx.Row
	done func()
}

func (r heldRow) Scan(dest ...any) error {
	defer r.done()
	return r.row.Scan(dest...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type heldRows struct {
	pgx.Rows
	cancel func()
}

func (r *heldRows) Close() {
	r.Rows.Close()
	r.cancel()
}

type heldBatch struct {
	pgx.BatchResults
	cancel func()
}

func (b heldBatch) Close() error {
	defer b.cancel()
	return b.BatchResults.Close()
}
