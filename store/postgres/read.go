package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkey/idemkey/store"
)

// rowSQL reads the key's row (%[1]s the quoted table name; $1 scope, $2 key):
// a primary-key SELECT of the stored columns and the server's now(), no lock,
// no transaction id, no WAL. It computes nothing: keyRow.judge applies
// claimSQL's tests to the row in Go, which costs the server less than
// expressions in the statement (each execution builds them anew). It is the
// first statement of a claim with WithReadFirst and the read of a
// one-transaction claim.
const rowSQL = `SELECT fingerprint, status, headers, body, body_omitted, created_at, completed_at, expires_at, lease_until, now()
FROM %[1]s WHERE scope = $1 AND key = $2`

// keyRow is a row of rowSQL.
type keyRow struct {
	fingerprint                        []byte
	status                             pgtype.Int2
	headers, body                      []byte
	omitted                            bool
	created, completed, expires, lease pgtype.Timestamptz
	now                                time.Time // the server's now() when it read the row
}

// dest returns the destinations of rowSQL's columns.
func (k *keyRow) dest() []any {
	return []any{&k.fingerprint, &k.status, &k.headers, &k.body, &k.omitted,
		&k.created, &k.completed, &k.expires, &k.lease, &k.now}
}

// judge returns the answer columns claimSQL would give a claim of fp for the
// row, judged at the row's now: headers and body only for the same
// fingerprint, the lease's time left in whole milliseconds rounded up (negative
// once lapsed), and stale (claimSQL's takeable) when the record is past its
// retention, or in flight for fp with its lease lapsed.
func (k *keyRow) judge(fp store.Fingerprint) claimRow {
	same := bytes.Equal(k.fingerprint, fp[:])
	r := claimRow{sameFP: same, status: k.status, omitted: k.omitted,
		created: k.created, completed: k.completed, expires: k.expires}
	if same {
		r.headers, r.body = k.headers, k.body
	}
	if k.lease.Valid {
		left := k.lease.Time.Sub(k.now)
		ms := int64(left / time.Millisecond) // toward zero: the ceiling of a negative
		if left%time.Millisecond > 0 {
			ms++
		}
		r.retryMS = pgtype.Int8{Int64: ms, Valid: true}
	}
	lapsed := !k.status.Valid && k.lease.Valid && !k.lease.Time.After(k.now) && same
	r.stale = !k.expires.Time.After(k.now) || lapsed
	return r
}

// readClaim answers req from rowSQL when the key's row decides it without a
// write: completed and within its retention (a replay, or a mismatch), or in
// flight with a live lease or another fingerprint. decided is false when there
// is no row or the row may be taken over: then claimSQL, the authority for
// every write, runs. args are claimSQL's arguments.
func (s *Store) readClaim(ctx context.Context, req store.ClaimRequest, tok store.Token, args []any) (
	_ store.ClaimResult, decided bool, _ error) {
	var k keyRow
	err := s.queryRow(ctx, s.readSQL, args[:2], k.dest()...)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return store.ClaimResult{}, false, nil // a new key
	case err != nil:
		return store.ClaimResult{}, false, fmt.Errorf("idemkey/store/postgres: claim: %w", err)
	}
	r := k.judge(req.Fingerprint)
	if r.stale {
		return store.ClaimResult{}, false, nil // expired, or its lease lapsed: a takeover
	}
	res, err := s.decide(&r, req, tok)
	return res, true, err
}
