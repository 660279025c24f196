package accounts

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/idemkey/idemkey/celeriant"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// PostgresProjection keeps the projection and the dedup index in Postgres, shared by all
// replicas (docs/account-service.md section 4.2). Cursor and index rows move together: every
// persist is one statement (a data-modifying CTE), so the default READ COMMITTED
// isolation suffices and no replica can see a cursor past an event without its index row.
// Index lifetimes run on the database clock (now()).
//
// Tables (names configurable with WithTablePrefix): account_balances (one row per account:
// balance, cursor, highest own ClientSeq) and request_responses (one row per (EventId,
// account) with the response and its expiry). Create them with Migrate.
type PostgresProjection struct {
	pool   *pgxpool.Pool
	window time.Duration
	prefix string

	balances, responses, responsesExpires, migrations string // quoted identifiers

	sqlLookup, sqlPersist, sqlSweep, sqlRecord, sqlEnsure string

	records atomic.Uint64 // recordWrite calls, for the periodic sweep
}

// sweepEvery is how many recordWrite calls of one projection run one expiry sweep.
// A fold sweeps only when it advances the cursor, and a replica whose own writes keep
// the cursor current never advances it by folding: without this the index table of a
// single replica would grow by one row per write forever (docs/account-service.md section 6.1.7).
const sweepEvery = 256

// PostgresOption configures a PostgresProjection.
type PostgresOption func(*PostgresProjection)

// WithTablePrefix prefixes every table and index name (default none: account_balances,
// request_responses, accounts_schema_migrations). Tests use a random prefix.
func WithTablePrefix(prefix string) PostgresOption {
	return func(p *PostgresProjection) { p.prefix = prefix }
}

// WithPostgresWindow sets the dedup window (default DefaultWindow); it is truncated to
// whole milliseconds, and values under 1 ms are ignored.
func WithPostgresWindow(d time.Duration) PostgresOption {
	return func(p *PostgresProjection) {
		if d >= time.Millisecond {
			p.window = d.Truncate(time.Millisecond)
		}
	}
}

// NewPostgresProjection returns a projection over pool. It does not touch the database;
// call Migrate once at startup (any replica, any number of times). A nil pool is an error.
func NewPostgresProjection(pool *pgxpool.Pool, opts ...PostgresOption) (*PostgresProjection, error) {
	if pool == nil {
		return nil, errors.New("accounts: NewPostgresProjection needs a pool")
	}
	p := &PostgresProjection{pool: pool, window: DefaultWindow}
	for _, o := range opts {
		o(p)
	}
	id := func(name string) string { return pgx.Identifier{p.prefix + name}.Sanitize() }
	p.balances = id("account_balances")
	p.responses = id("request_responses")
	p.responsesExpires = id("request_responses_expires_at_idx")
	p.migrations = id("accounts_schema_migrations")
	p.prepareSQL()
	return p, nil
}

// Window returns the dedup window.
func (p *PostgresProjection) Window() time.Duration { return p.window }

// Tables returns the quoted names of the projection's tables: balances, responses and
// the migrations ledger.
func (p *PostgresProjection) Tables() (balances, responses, migrations string) {
	return p.balances, p.responses, p.migrations
}

func (p *PostgresProjection) expand(sql string) string {
	return strings.NewReplacer(
		"{{balances}}", p.balances,
		"{{responses}}", p.responses,
		"{{responses_expires}}", p.responsesExpires,
		"{{migrations}}", p.migrations,
	).Replace(sql)
}

func (p *PostgresProjection) prepareSQL() {
	// lookup: one round trip for the projection row and the live index row. Driven by
	// the requested account id rather than by the projection row, so an index row is
	// visible even before the account's projection row exists (docs/account-service.md 6.2.6).
	p.sqlLookup = p.expand(`
SELECT b.balance_cents, b.last_version, b.last_client_seq, i.balance_cents, i.aggregate_version
FROM (SELECT $1::uuid AS id) k
LEFT JOIN {{balances}} b ON b.account_id = k.id
LEFT JOIN {{responses}} i ON i.aggregate_id = k.id AND i.event_id = $2::uuid AND i.expires_at > now()`)

	// persist after a fold: the CTE moves the cursor forward only; the main statement
	// upserts every index row of the fold (sorted by event id), refreshing the response
	// and never shrinking an expiry. The CTE runs although nothing references it.
	p.sqlPersist = p.expand(`
WITH cursor AS (
  INSERT INTO {{balances}} AS b (account_id, balance_cents, last_version, last_client_seq, updated_at)
  VALUES ($1, $2, $3, $4, now())
  ON CONFLICT (account_id) DO UPDATE
    SET balance_cents = EXCLUDED.balance_cents, last_version = EXCLUDED.last_version,
        last_client_seq = GREATEST(b.last_client_seq, EXCLUDED.last_client_seq), updated_at = now()
    WHERE b.last_version < EXCLUDED.last_version
  RETURNING 1
)
INSERT INTO {{responses}} AS r (event_id, aggregate_id, balance_cents, aggregate_version, expires_at)
SELECT u.eid, $1, u.bal, u.ver, now() + u.ms * interval '1 millisecond'
FROM unnest($5::uuid[], $6::bigint[], $7::bigint[], $8::bigint[]) AS u(eid, bal, ver, ms)
ON CONFLICT (event_id, aggregate_id) DO UPDATE
  SET balance_cents = EXCLUDED.balance_cents, aggregate_version = EXCLUDED.aggregate_version,
      expires_at = GREATEST(r.expires_at, EXCLUDED.expires_at)`)

	// The expiry sweep, separate: a delete and an upsert of one row in one statement is
	// undefined.
	p.sqlSweep = p.expand(`DELETE FROM {{responses}} WHERE expires_at < now()`)

	// recordWrite: the index row with the full window and the guarded cursor bump in one
	// statement. The bump is an upsert guarded by "cursor = expected", so the first write
	// to an account without a row creates it at once (the reference only updates and
	// leaves that to the next catch-up); the written state is exact either way.
	p.sqlRecord = p.expand(`
WITH cursor AS (
  INSERT INTO {{balances}} AS b (account_id, balance_cents, last_version, last_client_seq, updated_at)
  VALUES ($1, $3, $4, $5, now())
  ON CONFLICT (account_id) DO UPDATE
    SET balance_cents = EXCLUDED.balance_cents, last_version = EXCLUDED.last_version,
        last_client_seq = GREATEST(b.last_client_seq, EXCLUDED.last_client_seq), updated_at = now()
    WHERE b.last_version = $6::bigint
  RETURNING 1
)
INSERT INTO {{responses}} AS r (event_id, aggregate_id, balance_cents, aggregate_version, expires_at)
VALUES ($2, $1, $3, $4, now() + $7::bigint * interval '1 millisecond')
ON CONFLICT (event_id, aggregate_id) DO UPDATE
  SET balance_cents = EXCLUDED.balance_cents, aggregate_version = EXCLUDED.aggregate_version,
      expires_at = GREATEST(r.expires_at, EXCLUDED.expires_at)`)

	p.sqlEnsure = p.expand(`
INSERT INTO {{balances}} AS b (account_id, account_name) VALUES ($1, $2)
ON CONFLICT (account_id) DO UPDATE SET account_name = EXCLUDED.account_name WHERE b.account_name = ''`)
}

// Migrate creates or upgrades the projection's tables to the newest schema version. It
// is idempotent and safe to run from several replicas at once: migrations run in one
// transaction under an advisory lock keyed by the ledger's name, and each applied
// version is recorded in the ledger table.
func (p *PostgresProjection) Migrate(ctx context.Context) error {
	files, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("accounts: listing migrations: %w", err)
	}
	slices.Sort(files)
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("accounts: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, p.migrations); err != nil {
		return fmt.Errorf("accounts: migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, p.expand(`CREATE TABLE IF NOT EXISTS {{migrations}} (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now())`)); err != nil {
		return fmt.Errorf("accounts: migrate: ledger: %w", err)
	}
	var current int
	if err := tx.QueryRow(ctx, p.expand(`SELECT coalesce(max(version), 0) FROM {{migrations}}`)).Scan(&current); err != nil {
		return fmt.Errorf("accounts: migrate: ledger: %w", err)
	}
	for _, f := range files {
		base := f[strings.LastIndexByte(f, '/')+1:]
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("accounts: migration %s: bad version prefix: %w", base, err)
		}
		if v <= current {
			continue
		}
		body, err := migrationFS.ReadFile(f)
		if err != nil {
			return fmt.Errorf("accounts: migration %s: %w", base, err)
		}
		if _, err := tx.Exec(ctx, p.expand(string(body))); err != nil {
			return fmt.Errorf("accounts: migration %s: %w", base, err)
		}
		if _, err := tx.Exec(ctx, p.expand(`INSERT INTO {{migrations}} (version) VALUES ($1)`), v); err != nil {
			return fmt.Errorf("accounts: migration %s: ledger: %w", base, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("accounts: migrate: commit: %w", err)
	}
	return nil
}

// pgFailure marks err with ErrUnavailable (503) when it says the projection's database
// cannot be reached or dropped the connection: a failed connect, a network error or
// timeout, a closed connection or pool, or a server error of class 08 (connection
// exception), 57P01-57P03 (shutdown, cannot connect now) or 53300 (too many
// connections). Anything else (a missing table, a constraint) stays an internal error.
func pgFailure(err error) error {
	var connect *pgconn.ConnectError
	var netErr net.Error
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &connect), errors.As(err, &netErr), pgconn.Timeout(err), pgconn.SafeToRetry(err),
		errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, puddle.ErrClosedPool),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
	case errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "08") ||
		pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03" || pgErr.Code == "53300"):
	default:
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

func pgUUID(id uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: id, Valid: id != uuid.Nil} }

func (p *PostgresProjection) lookup(ctx context.Context, acct, eventID uuid.UUID) (State, Result, bool, error) {
	var bal, ver, seq, hbal, hver pgtype.Int8
	err := p.pool.QueryRow(ctx, p.sqlLookup, pgUUID(acct), pgUUID(eventID)).Scan(&bal, &ver, &seq, &hbal, &hver)
	if err != nil {
		return State{}, Result{}, false, pgFailure(fmt.Errorf("accounts: projection lookup of %s: %w", acct, err))
	}
	st := State{BalanceCents: bal.Int64, Version: uint64(ver.Int64), MaxClientSeq: uint64(seq.Int64)}
	if hbal.Valid && hver.Valid {
		return st, Result{BalanceCents: hbal.Int64, AggregateVersion: uint64(hver.Int64)}, true, nil
	}
	return st, Result{}, false, nil
}

func (p *PostgresProjection) fold(ctx context.Context, acct uuid.UUID, from State, batches []celeriant.Batch, clientID, eventID uuid.UUID, precision celeriant.Precision) (State, Result, bool, error) {
	var rows []indexEntry
	st := foldBatches(from, batches, clientID, p.window, precision, func(e indexEntry) { rows = append(rows, e) })
	var hit Result
	found := false
	if eventID != uuid.Nil {
		for _, r := range rows {
			if r.eventID == eventID {
				hit, found = r.res, true
			}
		}
	}
	if st.Version <= from.Version {
		return st, hit, found, nil
	}
	// Sorted by event id, one row per id (the last one folded): ON CONFLICT DO UPDATE
	// cannot touch a row twice in one statement, and replicas upserting in one order
	// cannot deadlock.
	slices.SortStableFunc(rows, func(a, b indexEntry) int { return cmp.Compare(string(a.eventID[:]), string(b.eventID[:])) })
	eids := make([]pgtype.UUID, 0, len(rows))
	bals := make([]int64, 0, len(rows))
	vers := make([]int64, 0, len(rows))
	mss := make([]int64, 0, len(rows))
	for i, r := range rows {
		if i+1 < len(rows) && rows[i+1].eventID == r.eventID {
			continue
		}
		eids = append(eids, pgUUID(r.eventID))
		bals = append(bals, r.res.BalanceCents)
		vers = append(vers, int64(r.res.AggregateVersion))
		mss = append(mss, r.remaining.Milliseconds())
	}
	if _, err := p.pool.Exec(ctx, p.sqlPersist, pgUUID(acct), st.BalanceCents, int64(st.Version), int64(st.MaxClientSeq),
		eids, bals, vers, mss); err != nil {
		return st, hit, found, pgFailure(fmt.Errorf("accounts: persisting the projection of %s: %w", acct, err))
	}
	if _, err := p.pool.Exec(ctx, p.sqlSweep); err != nil {
		return st, hit, found, pgFailure(fmt.Errorf("accounts: sweeping expired index rows: %w", err))
	}
	return st, hit, found, nil
}

func (p *PostgresProjection) recordWrite(ctx context.Context, acct, eventID uuid.UUID, res Result, expected, seq uint64) error {
	_, err := p.pool.Exec(ctx, p.sqlRecord, pgUUID(acct), pgUUID(eventID), res.BalanceCents, int64(res.AggregateVersion),
		int64(seq), int64(expected), p.window.Milliseconds())
	if err != nil {
		return pgFailure(fmt.Errorf("accounts: recording write of %s on %s: %w", eventID, acct, err))
	}
	if p.records.Add(1)%sweepEvery == 0 {
		if _, err := p.pool.Exec(ctx, p.sqlSweep); err != nil {
			return pgFailure(fmt.Errorf("accounts: sweeping expired index rows (the write itself is recorded): %w", err))
		}
	}
	return nil
}

func (p *PostgresProjection) ensureAccount(ctx context.Context, acct uuid.UUID, name string) error {
	if _, err := p.pool.Exec(ctx, p.sqlEnsure, pgUUID(acct), name); err != nil {
		return pgFailure(fmt.Errorf("accounts: ensuring projection row of %s: %w", acct, err))
	}
	return nil
}
