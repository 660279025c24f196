package postgres

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkey/idemkey/store/postgres/internal/sqltext"
)

// claimTx is the handler's pgx.Tx (TxFromContext): the claim's transaction, or
// a savepoint in it (sp set). Each call runs while the transaction is the
// handler's (the library has not taken it back), under the statement timeout,
// and refuses SQL that would end it (sqltext.EndsTx).
type claimTx struct {
	pgx.Tx
	c  *txClaim
	sp bool // a savepoint: its Commit and Rollback are its own
}

// hold takes the transaction for a call sending sqls, ctx bounded by the
// statement timeout (cancel); release gives it back. ErrTxOwned when an SQL
// text would end the transaction, pgx.ErrTxClosed once the library took it.
func (t *claimTx) hold(ctx context.Context, sqls ...string) (_ context.Context, release, cancel func(), err error) {
	for _, sql := range sqls {
		if sqltext.EndsTx(sql) {
			return nil, nil, nil, ErrTxOwned
		}
	}
	c := t.c
	select {
	case c.use <- struct{}{}:
	default:
		if c.row.Load() { // a QueryRow not yet scanned: waiting could be waiting for ourselves
			return nil, nil, nil, errRowOpen
		}
		c.use <- struct{}{}
	}
	if c.closed.Load() || c.conn.Conn().PgConn().TxStatus() == 'I' {
		<-c.use
		return nil, nil, nil, pgx.ErrTxClosed
	}
	ctx, cancel = context.WithTimeout(ctx, c.t.stmtTimeout)
	return ctx, func() { <-c.use }, cancel, nil
}

// call runs f, which sends sqls, holding the transaction.
func call[T any](t *claimTx, ctx context.Context, f func(context.Context) (T, error), sqls ...string) (v T, err error) {
	ctx, release, cancel, err := t.hold(ctx, sqls...)
	if err != nil {
		return v, err
	}
	defer cancel()
	defer release()
	return f(ctx)
}

// opened runs f, which opens results (Rows, a batch), bounded and
// counted open (take) until closer; the transaction is held only while f runs,
// so the handler's next call meets pgx's "conn busy", not a wait.
func opened[T any](t *claimTx, ctx context.Context, f func(context.Context) (T, error), sqls ...string) (v T, closer func(), err error) {
	ctx, release, cancel, err := t.hold(ctx, sqls...)
	if err != nil {
		return v, func() {}, err
	}
	defer release()
	t.c.open.Add(1)
	v, err = f(ctx)
	return v, sync.OnceFunc(func() { t.c.open.Add(-1); cancel() }), err
}

func (t *claimTx) Commit(ctx context.Context) error   { return t.end(ctx, t.Tx.Commit) }
func (t *claimTx) Rollback(ctx context.Context) error { return t.end(ctx, t.Tx.Rollback) }

// end is a savepoint's Commit or Rollback f; the transaction's own are ErrTxOwned.
func (t *claimTx) end(ctx context.Context, f func(context.Context) error) error {
	if !t.sp {
		return ErrTxOwned
	}
	_, err := call(t, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, f(ctx) })
	return err
}

// Begin opens a savepoint, held as the transaction is.
func (t *claimTx) Begin(ctx context.Context) (pgx.Tx, error) {
	sp, err := call(t, ctx, t.Tx.Begin)
	if err != nil {
		return nil, err
	}
	return &claimTx{Tx: sp, c: t.c, sp: true}, nil
}

// Conn and LargeObjects are side doors: the commit trusts only its fence.
func (t *claimTx) Conn() *pgx.Conn {
	t.c.sideDoor.Store(true)
	return t.Tx.Conn()
}

func (t *claimTx) LargeObjects() pgx.LargeObjects { t.Conn(); return t.Tx.LargeObjects() }

func (t *claimTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	return call(t, ctx, func(ctx context.Context) (int64, error) { return t.Tx.CopyFrom(ctx, table, cols, src) })
}

func (t *claimTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return call(t, ctx, func(ctx context.Context) (*pgconn.StatementDescription, error) { return t.Tx.Prepare(ctx, name, sql) }, sql)
}

func (t *claimTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return call(t, ctx, func(ctx context.Context) (pgconn.CommandTag, error) { return t.Tx.Exec(ctx, sql, args...) }, sql)
}

func (t *claimTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	sqls := make([]string, len(b.QueuedQueries))
	for i, q := range b.QueuedQueries {
		sqls[i] = q.SQL
	}
	br, closer, err := opened(t, ctx, func(ctx context.Context) (pgx.BatchResults, error) { return t.Tx.SendBatch(ctx, b), nil }, sqls...)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return heldBatch{BatchResults: br, closer: closer}
}

// Query's Rows are counted open until closed or read to their end.
func (t *claimTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, closer, err := opened(t, ctx, func(ctx context.Context) (pgx.Rows, error) { return t.Tx.Query(ctx, sql, args...) }, sql)
	if err != nil {
		closer()
		return nil, err
	}
	return &heldRows{Rows: rows, closer: closer}, nil
}

// QueryRow holds the transaction until the row is scanned (a call under way,
// which the commit waits for); the handler's next call before that Scan gets
// errRowOpen at once (hold), as pgx's "conn busy" on a plain pgx.Tx, instead
// of waiting for a Scan that would follow it.
func (t *claimTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	ctx, release, cancel, err := t.hold(ctx, sql)
	if err != nil {
		return &heldRow{err: err}
	}
	t.c.row.Store(true)
	return &heldRow{row: t.Tx.QueryRow(ctx, sql, args...), done: func() { t.c.row.Store(false); release(); cancel() }}
}

type heldRow struct {
	row  pgx.Row
	err  error
	done func() // the first Scan gives the transaction back
}

func (r *heldRow) Scan(dest ...any) error {
	if done := r.done; done != nil {
		r.done = nil
		defer done()
	}
	if r.err != nil {
		return r.err
	}
	return r.row.Scan(dest...)
}

type heldRows struct {
	pgx.Rows
	closer func()
}

func (r *heldRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.closer()
	return false
}

func (r *heldRows) Close() {
	r.Rows.Close()
	r.closer()
}

type heldBatch struct {
	pgx.BatchResults
	closer func()
}

func (b heldBatch) Close() error {
	defer b.closer()
	return b.BatchResults.Close()
}
