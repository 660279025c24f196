package postgres

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// claimTx is the handler's pgx.Tx (TxFromContext): the claim's transaction, or
// a savepoint in it (root set). Each call runs while the transaction is the
// handler's (the library has not taken it back), under the statement timeout,
// and refuses SQL that would end it (endsTx).
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
	if endsTx(sql) {
		return nil, nil, nil, ErrTxOwned
	}
	t.c.use.Lock()
	t.c.mu.Lock()
	closed := t.c.closed
	t.c.mu.Unlock()
	if closed || t.c.conn.Conn().PgConn().TxStatus() == 'I' {
		t.c.use.Unlock()
		return nil, nil, nil, pgx.ErrTxClosed
	}
	ctx, cancel = context.WithTimeout(ctx, t.c.t.stmtTimeout)
	return ctx, t.c.use.Unlock, cancel, nil
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
		if endsTx(q.SQL) {
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

// endsTx reports whether sql holds a statement that would end the transaction:
// COMMIT, END, ABORT, ROLLBACK (not ROLLBACK TO a savepoint), PREPARE
// TRANSACTION. It reads the first words of each statement, past comments and
// quoted text; a function's body (dollar-quoted) cannot end the transaction of
// its caller (the server refuses).
func endsTx(sql string) bool {
	var words []string
	for i := 0; i <= len(sql); i++ {
		if i == len(sql) || sql[i] == ';' {
			if stmtEnds(words) {
				return true
			}
			words = words[:0]
			continue
		}
		switch ch := sql[i]; {
		case ch == '-' && strings.HasPrefix(sql[i:], "--"):
			i += strings.IndexByte(sql[i:]+"\n", '\n')
		case ch == '/' && strings.HasPrefix(sql[i:], "/*"):
			i = skipComment(sql, i)
		case ch == '\'' || ch == '"':
			escapes := ch == '\'' && i > 0 && sql[i-1]|0x20 == 'e' && (i == 1 || !isWordByte(sql[i-2]))
			i = skipQuoted(sql, i, ch, escapes)
		case ch == '$':
			if j := strings.IndexByte(sql[i+1:], '$'); j >= 0 && isTag(sql[i+1:i+1+j]) {
				tag := sql[i : i+j+2]
				k := strings.Index(sql[i+len(tag):], tag)
				if k < 0 {
					return false
				}
				i += len(tag) + k + len(tag) - 1
			}
		case isWordByte(ch) && (i == 0 || !isWordByte(sql[i-1])) && len(words) < 3:
			j := i
			for j < len(sql) && isWordByte(sql[j]) {
				j++
			}
			words = append(words, strings.ToLower(sql[i:j]))
			i = j - 1
		}
	}
	return false
}

// stmtEnds reports whether a statement starting with words ends the transaction.
func stmtEnds(words []string) bool {
	if len(words) == 0 {
		return false
	}
	switch words[0] {
	case "commit", "end", "abort":
		return true
	case "rollback": // ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name keeps it
		if len(words) > 1 && (words[1] == "work" || words[1] == "transaction") {
			words = words[1:]
		}
		return len(words) < 2 || words[1] != "to"
	case "prepare":
		return len(words) > 1 && words[1] == "transaction"
	}
	return false
}

func isWordByte(ch byte) bool {
	return ch == '_' || ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9'
}

func isTag(s string) bool {
	for i := range len(s) {
		if !isWordByte(s[i]) || i == 0 && s[i] >= '0' && s[i] <= '9' {
			return false
		}
	}
	return true
}

func skipComment(sql string, i int) int {
	depth := 0
	for ; i < len(sql)-1; i++ {
		switch sql[i : i+2] {
		case "/*":
			depth++
			i++
		case "*/":
			if depth--; depth == 0 {
				return i + 1
			}
			i++
		}
	}
	return len(sql) - 1
}

// skipQuoted returns the index of the quote that closes the one at i (doubled
// quotes and, in an E” string, backslash escapes skipped).
func skipQuoted(sql string, i int, q byte, escapes bool) int {
	for i++; i < len(sql); i++ {
		if escapes && sql[i] == '\\' {
			i++
			continue
		}
		if sql[i] == q {
			if i+1 < len(sql) && sql[i+1] == q {
				i++
				continue
			}
			return i
		}
	}
	return len(sql) - 1
}
