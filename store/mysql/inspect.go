package mysql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemkey/idemkey/store"
)

// Inspect implements store.Inspector with one plain SELECT (no lock, nothing
// written). Times are the server's (UTC_TIMESTAMP(6), microseconds). Errors:
// store.ErrInvalid for a bad id, store.ErrCorrupt for a row that cannot be
// decoded, otherwise the driver's error, wrapped.
func (s *Store) Inspect(ctx context.Context, id store.ID) (store.Info, error) {
	if err := store.ValidateInspect(id); err != nil {
		return store.Info{}, err
	}
	st, err := s.stmts.get(ctx, s.sqlOf.inspect)
	if err != nil {
		return store.Info{}, fmt.Errorf("idemkey/store/mysql: inspect: %w", err)
	}
	return scanInfo("inspect", st.QueryRowContext(ctx, bytesOf(id.Scope), bytesOf(id.Key)))
}

// Evict implements store.Inspector in one short transaction: a locking read of
// the key's row (SELECT ... FOR UPDATE reads the newest committed version and
// waits for a concurrent claim or completion), the judgement against policy, and
// the DELETE of that row if allowed, then COMMIT. So the state reported is the
// state judged, and a claim taken over meanwhile is never removed as abandoned.
// Errors as for Inspect, and store.ErrInvalid for an empty policy.
func (s *Store) Evict(ctx context.Context, id store.ID, policy store.EvictPolicy) (store.Info, bool, error) {
	if err := store.ValidateEvict(id, policy); err != nil {
		return store.Info{}, false, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Info{}, false, fmt.Errorf("idemkey/store/mysql: evict: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	scope, key := bytesOf(id.Scope), bytesOf(id.Key)
	info, err := scanInfo("evict", tx.QueryRowContext(ctx, s.sqlOf.lockRow, scope, key))
	if err != nil || !policy.Allows(info) {
		return info, false, err
	}
	if _, err := tx.ExecContext(ctx, s.sqlOf.evict, scope, key); err != nil {
		return store.Info{}, false, fmt.Errorf("idemkey/store/mysql: evict: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return store.Info{}, false, fmt.Errorf("idemkey/store/mysql: evict: commit: %w", err)
	}
	return info, true, nil
}

func scanInfo(op string, row *sql.Row) (store.Info, error) {
	var (
		nowUS                                  int64
		created, completed, expires, lease, bb sql.NullInt64
		fp                                     []byte
		status                                 sql.NullInt16
		omitted                                sql.NullBool
	)
	if err := row.Scan(&nowUS, &fp, &status, &created, &completed, &expires, &lease, &bb, &omitted); err != nil {
		return store.Info{}, fmt.Errorf("idemkey/store/mysql: %s: %w", op, err)
	}
	info := store.Info{Now: fromMicros(nowUS)}
	if !created.Valid {
		return info, nil
	}
	if len(fp) != len(info.Fingerprint) || !expires.Valid {
		return store.Info{}, fmt.Errorf("idemkey/store/mysql: %w: %s: row with a %d-byte fingerprint", store.ErrCorrupt, op, len(fp))
	}
	copy(info.Fingerprint[:], fp)
	info.CreatedAt, info.ExpiresAt = fromMicros(created.Int64), fromMicros(expires.Int64)
	if !status.Valid {
		if !lease.Valid {
			return store.Info{}, fmt.Errorf("idemkey/store/mysql: %w: %s: in-flight record without a lease deadline", store.ErrCorrupt, op)
		}
		info.State, info.LeaseUntil = store.StateInFlight, fromMicros(lease.Int64)
		return info, nil
	}
	info.State = store.StateCompleted
	info.Status = int(status.Int16)
	info.CompletedAt = fromMicros(completed.Int64)
	info.BodyBytes = int(bb.Int64)
	info.BodyOmitted = omitted.Bool
	return info, nil
}
