package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
)

// errDeadlock is InnoDB's ER_LOCK_DEADLOCK: concurrent inserts of the same new key
// can deadlock on the duplicate-key locks, and the server rolls one back.
const errDeadlock = 1213

// Claim implements store.Store (see the package doc): a plain read of the key's
// row answers replays, in-flight duplicates and mismatches; only when there is no
// row, or it may be taken, does one INSERT ... ON DUPLICATE KEY UPDATE claim it,
// re-checking the takeover on the newest row version under the row's lock. When
// that statement finds the key taken by a concurrent claim, or InnoDB rolls it
// back as a deadlock victim, Claim reads again (at most 8 statements of each
// kind in all), so the answer is always definite. Errors: store.ErrInvalid for
// bad arguments, store.ErrCorrupt for undecodable rows, otherwise the driver's
// error (connection, timeout, cancellation) wrapped.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := req.Validate(); err != nil {
		return store.ClaimResult{}, err
	}
	read, err := s.stmts.get(ctx, s.sqlOf.read)
	if err != nil {
		return store.ClaimResult{}, fmt.Errorf("idemkey/store/mysql: claim: %w", err)
	}
	tok := req.ClaimToken()
	scope, key, fp := bytesOf(req.Scope), bytesOf(req.Key), req.Fingerprint[:]
	for attempt := range claimAttempts {
		if attempt > 0 {
			s.claimRetries.Add(1)
		}
		var r claimRow
		err := read.QueryRowContext(ctx, fp, fp, fp, fp, scope, key).Scan(&r.sameFP, &r.status, &r.headers, &r.body,
			&r.omitted, &r.created, &r.completed, &r.expires, &r.retryMS, &r.takeable)
		switch {
		case err == nil && !r.takeable:
			return s.decide(&r, req)
		case err != nil && !errors.Is(err, sql.ErrNoRows):
			return store.ClaimResult{}, fmt.Errorf("idemkey/store/mysql: claim: %w", err)
		}
		code, err := s.insert(ctx, scope, key, fp, tok[:], micros(req.Lease), micros(req.Retention))
		switch {
		case isDeadlock(err):
			continue // a concurrent claim of the same new key won: read again
		case err != nil:
			return store.ClaimResult{}, fmt.Errorf("idemkey/store/mysql: claim: %w", err)
		case code == codeRefused:
			continue // the key was claimed after our read: read again
		case code == codeInserted || code == codeReplaced || code == codeTakeover:
			return store.ClaimResult{Outcome: store.Claimed, Token: tok, Takeover: code == codeTakeover}, nil
		}
		return store.ClaimResult{}, fmt.Errorf("idemkey/store/mysql: claim: unexpected claim code %d", code)
	}
	return store.ClaimResult{}, fmt.Errorf("idemkey/store/mysql: claim: no definite answer after %d attempts under contention", claimAttempts)
}

// insert runs the claim statement and returns its claim code.
func (s *Store) insert(ctx context.Context, scope, key, fp, tok []byte, lease, retention int64) (int64, error) {
	st, err := s.stmts.get(ctx, s.sqlOf.claim)
	if err != nil {
		return 0, err
	}
	res, err := st.ExecContext(ctx, claimArgs(scope, key, fp, tok, lease, retention)...)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

func isDeadlock(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errDeadlock
}

type claimRow struct {
	sameFP, omitted, takeable   bool
	status                      sql.NullInt16
	headers, body               []byte
	created, completed, expires sql.NullInt64 // microseconds since the epoch
	retryMS                     sql.NullInt64
}

func (s *Store) decide(r *claimRow, req store.ClaimRequest) (store.ClaimResult, error) {
	return codec.Answer(&codec.Row{
		SameFingerprint: r.sameFP,
		Completed:       r.status.Valid, Status: int(r.status.Int16),
		Headers: r.headers, Body: r.body, BodyOmitted: r.omitted,
		HasLease: r.retryMS.Valid, RetryMS: r.retryMS.Int64,
		HasTimes:  r.created.Valid && r.completed.Valid && r.expires.Valid,
		CreatedAt: fromMicros(r.created.Int64), CompletedAt: fromMicros(r.completed.Int64), ExpiresAt: fromMicros(r.expires.Int64),
	}, req.Fingerprint, s.maxBody)
}

// fromMicros is the UTC time us microseconds after the Unix epoch.
func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }
