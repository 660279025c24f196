package mysql

import (
	"fmt"
	"strings"
)

// now is the store's clock: the server's UTC time in microseconds, fixed for the
// duration of one statement.
const now = "UTC_TIMESTAMP(6)"

// micro returns the SQL of a DATETIME column as microseconds since the Unix epoch
// (BIGINT; NULL for NULL), so reading times depends on no DSN setting (parseTime,
// loc) and no session time zone.
func micro(col string) string {
	return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + col + ")"
}

// statements is the SQL of one table, rendered once by New.
type statements struct {
	read, claim, complete, completed, release, renew, sweep, live, inspect, lockRow, evict string
}

// Claim codes: the claim statement sets LAST_INSERT_ID(code) on every path, and
// the server returns it in the statement's OK packet (sql.Result.LastInsertId),
// so the answer does not depend on the rows-affected count (which the DSN's
// clientFoundRows changes).
const (
	codeTakeover = 1 // an uncompleted record whose lease expired, same fingerprint: taken over
	codeReplaced = 2 // a record past its retention: replaced as a new key
	codeInserted = 3 // no record: inserted
	codeRefused  = 4 // the record is held or completed: left untouched
)

// taken is true, in the ON DUPLICATE KEY UPDATE of the claim, when the existing
// row may be taken: past its retention (any fingerprint), or uncompleted with an
// expired lease and the same fingerprint. The first assignment sets the token to
// the claimer's; "token = ?" keeps every later assignment's test true once it
// did, whether the server assigns left to right (MySQL, MariaDB's default) or
// from the old row (MariaDB's SIMULTANEOUS_ASSIGNMENT mode). Arguments: token,
// fingerprint.
const taken = `(token = ? OR expires_at <= ` + now + ` OR (status IS NULL AND lease_until <= ` + now + ` AND fingerprint = ?))`

func newStatements(t string) statements {
	record := `fingerprint = ?, status, IF(fingerprint = ?, headers, NULL), IF(fingerprint = ?, body, NULL), body_omitted, ` +
		micro("created_at") + `, ` + micro("completed_at") + `, ` + micro("expires_at") + `, ` +
		`CAST(CEIL(TIMESTAMPDIFF(MICROSECOND, ` + now + `, lease_until) / 1000) AS SIGNED)`
	set := func(col, val string) string { return fmt.Sprintf("    %s = IF(%s, %s, %s)", col, taken, val, col) }
	holder := "scope = ? AND `key` = ? AND token = ? AND status IS NULL AND expires_at > " + now
	info := micro(now) + `, fingerprint, status, ` + micro("created_at") + `, ` + micro("completed_at") + `, ` +
		micro("expires_at") + `, ` + micro("lease_until") + `, OCTET_LENGTH(body), body_omitted`
	return statements{
		// read is a plain (consistent, non-locking) read of the key's row; the
		// last column says whether the claim may take it.
		read: `SELECT ` + record + `,
    expires_at <= ` + now + ` OR (status IS NULL AND lease_until <= ` + now + ` AND fingerprint = ?)
FROM ` + t + " WHERE scope = ? AND `key` = ?",

		// claim inserts the key, or takes the existing row when it may be taken
		// (re-checked on the newest row version, under its lock); the
		// assignments test the old row's expires_at before it is assigned.
		claim: `INSERT INTO ` + t + " (scope, `key`, fingerprint, token, lease_until, body_omitted, created_at, expires_at)" + `
VALUES (?, ?, ?, ?, ` + now + ` + INTERVAL ? MICROSECOND, LAST_INSERT_ID(3) = 0, ` + now + `, ` + now + ` + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
` + strings.Join([]string{
			set("token", "?"),
			// created_at is kept by a takeover and set anew for a record past
			// its retention; the two branches set the claim code.
			"    created_at = IF(" + taken + `, IF(LAST_INSERT_ID(IF(expires_at > ` + now + `, 1, 2)) = 1, created_at, ` + now + `),
        IF(LAST_INSERT_ID(4) = 4, created_at, created_at))`,
			set("fingerprint", "?"),
			set("status", "NULL"),
			set("headers", "NULL"),
			set("body", "NULL"),
			set("body_omitted", "FALSE"),
			set("completed_at", "NULL"),
			set("lease_until", now+" + INTERVAL ? MICROSECOND"),
			set("expires_at", now+" + INTERVAL ? MICROSECOND"),
		}, ",\n"),

		complete: `UPDATE ` + t + ` SET status = ?, headers = ?, body = ?, body_omitted = ?, lease_until = NULL,
    completed_at = ` + now + `, expires_at = ` + now + ` + INTERVAL ? MICROSECOND
WHERE ` + holder,

		// completed is Complete's look after a refusal: did token complete the
		// record with this status, body and omitted mark (a completion retried
		// after its reply was lost)? The rows-affected count of complete cannot
		// tell (an update that changes nothing counts 0 without clientFoundRows).
		completed: `SELECT COUNT(*) FROM ` + t + " WHERE scope = ? AND `key` = ? AND token = ? AND status = ? AND body <=> ? AND body_omitted = ? AND expires_at > " + now,

		release: `DELETE FROM ` + t + ` WHERE ` + holder,

		renew: `UPDATE ` + t + ` SET lease_until = ` + now + ` + INTERVAL ? MICROSECOND,
    expires_at = GREATEST(expires_at, ` + now + ` + INTERVAL ? MICROSECOND)
WHERE ` + holder,

		// sweep deletes one batch of expired rows through the expiry index.
		sweep: `DELETE FROM ` + t + ` WHERE expires_at <= ` + now + ` ORDER BY expires_at LIMIT ?`,

		// live is Wait's look: does the key hold a live claim?
		live: `SELECT COUNT(*) FROM ` + t + " WHERE scope = ? AND `key` = ? AND status IS NULL AND lease_until > " + now +
			` AND expires_at > ` + now,

		// inspect is a plain read; the LEFT JOIN answers one row, with the
		// server's now, also for an absent key.
		inspect: `SELECT ` + info + ` FROM (SELECT 1) AS one LEFT JOIN ` + t +
			" ON scope = ? AND `key` = ? AND expires_at > " + now,

		// lockRow is Evict's locking read (it reads the newest committed version
		// and holds the row until the transaction ends).
		lockRow: `SELECT ` + info + ` FROM (SELECT 1) AS one LEFT JOIN ` + t +
			" ON scope = ? AND `key` = ? AND expires_at > " + now + ` FOR UPDATE`,

		evict: `DELETE FROM ` + t + " WHERE scope = ? AND `key` = ?",
	}
}

// claimArgs returns the arguments of the claim statement.
func claimArgs(scope, key, fp, tok []byte, lease, retention int64) []any {
	args := []any{scope, key, fp, tok, lease, retention}
	add := func(extra ...any) { args = append(args, tok, fp); args = append(args, extra...) }
	add(tok)       // token
	add()          // created_at
	add(fp)        // fingerprint
	add()          // status
	add()          // headers
	add()          // body
	add()          // body_omitted
	add()          // completed_at
	add(lease)     // lease_until
	add(retention) // expires_at
	return args
}
