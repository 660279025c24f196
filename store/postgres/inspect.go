package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkey/idemkey/store"
)

var _ store.Inspector = (*Store)(nil)

// The operator's statements, one each; %[1]s is the quoted table name. A row past
// its retention is absent to both, as to a claim. Both answer exactly one row,
// with the server's now() first.
const (
	recordColumns = `fingerprint, status, created_at, completed_at, expires_at, lease_until, octet_length(body), body_omitted`

	// inspectSQL is a plain read: no lock, no write.
	inspectSQL = `SELECT now(), false, ` + recordColumns + `
FROM (SELECT 1) AS one LEFT JOIN %[1]s ON scope = $1 AND key = $2 AND expires_at > now()`

	// evictSQL locks the row (FOR UPDATE: under READ COMMITTED it waits for a
	// concurrent claim or completion and then reads the row as committed), judges
	// it against the policy ($3 a completed record, $4 an in-flight one whose
	// lease expired, $5 one whose lease is live) and deletes it if allowed. So the
	// state reported is the state judged, and a claim taken over meanwhile is
	// never removed as abandoned.
	evictSQL = `WITH found AS (
    SELECT ` + recordColumns + `,
           octet_length(fingerprint) = 32 AND CASE WHEN status IS NOT NULL THEN $3::boolean
                                                   WHEN lease_until IS NULL THEN false
                                                   WHEN lease_until <= now() THEN $4::boolean
                                                   ELSE $5::boolean END AS allowed
    FROM %[1]s
    WHERE scope = $1 AND key = $2 AND expires_at > now()
    FOR UPDATE
), gone AS (
    DELETE FROM %[1]s WHERE scope = $1 AND key = $2 AND (SELECT allowed FROM found)
    RETURNING CASE WHEN waiters THEN pg_notify('%[2]s', encode(sha256(int4send(length(scope)) || scope || key), 'hex')) END
)
SELECT now(), EXISTS (SELECT FROM gone), f.fingerprint, f.status, f.created_at, f.completed_at, f.expires_at,
       f.lease_until, f.octet_length, f.body_omitted
FROM (SELECT 1) AS one LEFT JOIN found AS f ON true`
)

// Inspect implements store.Inspector with one SELECT (no lock, nothing written).
// Times are the server's (now(), microseconds). Errors: store.ErrInvalid for a bad
// id , store.ErrCorrupt for a row that cannot be
// decoded, otherwise the driver's error, wrapped.
func (s *Store) Inspect(ctx context.Context, id store.ID) (store.Info, error) {
	if err := store.ValidateInspect(id); err != nil {
		return store.Info{}, err
	}
	info, _, err := s.scanInfo(ctx, "inspect", fmt.Sprintf(inspectSQL, s.qualified), bytesOf(id.Scope), bytesOf(id.Key))
	return info, err
}

// Evict implements store.Inspector with one statement: it locks the key's row,
// judges it against the policy and deletes it if allowed (a refused Evict still
// takes the row lock for the statement's duration).
// Errors as for Inspect, and store.ErrInvalid for an empty policy.
func (s *Store) Evict(ctx context.Context, id store.ID, policy store.EvictPolicy) (store.Info, bool, error) {
	if err := store.ValidateEvict(id, policy); err != nil {
		return store.Info{}, false, err
	}
	return s.scanInfo(ctx, "evict", fmt.Sprintf(evictSQL, s.qualified, s.channel), bytesOf(id.Scope), bytesOf(id.Key),
		policy&store.EvictCompleted != 0, policy&store.EvictLeaseExpired != 0, policy&store.EvictLive != 0)
}

func (s *Store) scanInfo(ctx context.Context, op, sql string, args ...any) (store.Info, bool, error) {
	var (
		now, created, completed, expires, lease pgtype.Timestamptz
		evicted                                 bool
		fp                                      []byte
		status                                  pgtype.Int2
		bodyBytes                               pgtype.Int4
		omitted                                 pgtype.Bool
	)
	err := s.queryRow(ctx, sql, args, &now, &evicted, &fp, &status, &created, &completed, &expires, &lease, &bodyBytes, &omitted)
	if err != nil {
		return store.Info{}, false, fmt.Errorf("idemkey/store/postgres: %s: %w", op, err)
	}
	info := store.Info{Now: now.Time}
	if !created.Valid {
		return info, false, nil
	}
	if len(fp) != len(info.Fingerprint) || !expires.Valid {
		return store.Info{}, false, fmt.Errorf("idemkey/store/postgres: %w: %s: row with a %d-byte fingerprint", store.ErrCorrupt, op, len(fp))
	}
	copy(info.Fingerprint[:], fp)
	info.CreatedAt, info.ExpiresAt = created.Time, expires.Time
	if !status.Valid {
		if !lease.Valid {
			return store.Info{}, false, fmt.Errorf("idemkey/store/postgres: %w: %s: in-flight record without a lease deadline", store.ErrCorrupt, op)
		}
		info.State, info.LeaseUntil = store.StateInFlight, lease.Time
		return info, evicted, nil
	}
	info.State = store.StateCompleted
	info.Status = int(status.Int16)
	info.CompletedAt = completed.Time
	info.BodyBytes = int(bodyBytes.Int32)
	info.BodyOmitted = omitted.Bool
	return info, evicted, nil
}
