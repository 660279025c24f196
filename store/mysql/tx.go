package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemkey/idemkey/store"
)

// CompleteTx completes id's record inside the caller's transaction tx, fenced by
// token: one UPDATE of the store's table, no other round trip. It is the
// in-transaction form of Complete (same arguments, validation and encoding), for
// a handler whose side effect lives in the same database: the record and the
// side effect then commit or roll back together (docs/architecture.md section 9).
//
// Errors: store.ErrLeaseLost (wrapped) when token no longer owns the key (its
// lease expired and a retry took the key over, or the record expired): the
// caller must roll back, so a stale holder's side effect never commits.
// store.ErrInvalid for bad arguments (nothing sent), otherwise the driver's error
// wrapped; tx is left to the caller either way.
//
// tx must be a transaction on the store's database (db.BeginTx of the *sql.DB
// given to New, or one on the same server that can see the table). The UPDATE
// is a locking write: whatever tx's isolation level, it tests the token on the
// newest committed row version, and it holds the row's lock until tx ends, so
// keep the transaction short after it (a retry that takes over an expired lease
// waits for it). The completion time and retention are counted from the
// UPDATE (the server's UTC_TIMESTAMP(6) of that statement).
//
// After commit, tell the middleware with claim.MarkCompleted (this module
// does not import the middleware).
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if tx == nil {
		return fmt.Errorf("idemkey/store/mysql: %w: nil transaction", store.ErrInvalid)
	}
	if err := s.checkComplete(id, token, resp, retention); err != nil {
		return err
	}
	st, err := s.stmts.get(ctx, s.sqlOf.complete)
	if err != nil {
		return fmt.Errorf("idemkey/store/mysql: complete in transaction: %w", err)
	}
	res, err := tx.StmtContext(ctx, st).ExecContext(ctx, completeArgs(id, token, resp, retention)...)
	return holderResult("complete in transaction", res, err)
}
