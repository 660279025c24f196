package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/store"
)

// readSQL is the first statement of a claim in the plain layout (%[1]s the
// quoted table name; $1 scope, $2 key, $3 fingerprint): a primary-key SELECT of
// the key's row, no lock, no transaction id, no WAL. Its columns are the answer
// columns of claimSQL (from the fingerprint test on), judged on the same clock
// (now()); the last, takeable, is claimSQL's takeover test. No row, or a
// takeable one, leaves the claim to claimSQL.
const readSQL = `SELECT fingerprint = $3, status,
       CASE WHEN fingerprint = $3 THEN headers END,
       CASE WHEN fingerprint = $3 THEN body END,
       body_omitted, created_at, completed_at, expires_at,
       ceil(extract(epoch FROM lease_until - now()) * 1000)::bigint,
       coalesce(expires_at <= now() OR (status IS NULL AND lease_until <= now() AND fingerprint = $3), false)
FROM %[1]s
WHERE scope = $1 AND key = $2`

// readClaim answers req from readSQL when the key's row decides it without a
// write: completed and within its retention (a replay, or a mismatch), or in
// flight with a live lease or another fingerprint. decided is false when there
// is no row or the row may be taken over: then claimSQL, the authority for
// every write, runs. args are claimSQL's arguments.
func (s *Store) readClaim(ctx context.Context, req store.ClaimRequest, tok store.Token, args []any) (
	_ store.ClaimResult, decided bool, _ error) {
	var r claimRow
	err := s.queryRow(ctx, s.readSQL, args[:3], r.dest()[2:]...)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return store.ClaimResult{}, false, nil // a new key
	case err != nil:
		return store.ClaimResult{}, false, fmt.Errorf("idemkey/postgres: claim: %w", err)
	case r.stale:
		return store.ClaimResult{}, false, nil // expired, or its lease lapsed: a takeover
	}
	res, err := s.decide(&r, req, tok)
	return res, true, err
}
