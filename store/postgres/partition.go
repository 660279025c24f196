package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres/internal/migrate"
)

// Bounds of WithPartitions' epoch.
const (
	// MinEpoch is the shortest epoch of the partitioned layout.
	MinEpoch = time.Minute
	// MaxEpoch is the longest epoch of the partitioned layout.
	MaxEpoch = 366 * 24 * time.Hour
	// partitionsAhead is how many epochs after the current one Migrate and Sweep
	// keep a partition for.
	partitionsAhead = 2
	// expiredLockWait bounds, in milliseconds, how long the sweep waits for a
	// partition's SHARE lock before it leaves the partition to the next sweep;
	// writers queue behind the lock request for at most that long.
	expiredLockWait = 200
	// epochComment prefixes the comment that records the epoch on the table.
	epochComment = "idemkey partitioned layout, epoch seconds: "
)

// WithPartitions selects the partitioned layout (docs/stores.md, "Retention at
// scale"): records live in a table partitioned by the epoch, of length epoch, in
// which they were claimed, and Sweep removes expired records by dropping whole
// partitions (DETACH PARTITION CONCURRENTLY, then DROP TABLE), at a cost that
// does not grow with the rows removed. epoch is whole seconds from MinEpoch to
// MaxEpoch; choose it at least as long as the longest retention (and lease) the
// application uses, since a partition is dropped only once every record in it
// has expired, about two epochs after its start when retentions fit in one.
// The default is the plain table. New refuses (store.ErrInvalid) an epoch out of
// bounds or not whole seconds, and WithTransactionPooler or WithQueryExecMode
// alongside it (the sweep needs a session of its own); OneTx refuses the layout;
// Migrate refuses a table of the other layout or of another epoch, Sweep one of
// another epoch. The claim needs READ COMMITTED (the default): under another
// isolation it fails with SQLSTATE 0A000. A sweep stopped between a detach and
// its drop leaves a table the next sweep drops (it marks a partition with a
// comment before detaching it and drops no table without that mark).
func WithPartitions(epoch time.Duration) Option {
	return func(s *Store) { s.part = &partitioned{s: s, epoch: epoch} }
}

// partitioned is the partitioned layout (WithPartitions): its epoch, and what only
// it runs: its migrations' placeholders, its claim attempt, the creation of
// partitions and the sweep that drops them (partition_sweep.go). A Store of the
// plain layout has none.
type partitioned struct {
	s     *Store
	epoch time.Duration
}

//go:embed migrations_partitioned/*.sql
var partitionedFiles embed.FS

// errPartitionedOneTx is OneTx's answer in the partitioned layout.
var errPartitionedOneTx = fmt.Errorf("idemkey/store/postgres: %w: the one-transaction mode (OneTx) does not support the partitioned layout (WithPartitions)", store.ErrInvalid)

// useLayout checks the partitioned layout's options and installs its statements;
// it does nothing for the plain layout. Called by New once the names are set.
func (s *Store) useLayout() error {
	p := s.part
	if p == nil {
		return nil
	}
	switch {
	case p.epoch < MinEpoch || p.epoch > MaxEpoch || p.epoch%time.Second != 0:
		return fmt.Errorf("idemkey/store/postgres: %w: partition epoch %v must be whole seconds from %v to %v", store.ErrInvalid, p.epoch, MinEpoch, MaxEpoch)
	case s.forceMode:
		return fmt.Errorf("idemkey/store/postgres: %w: the partitioned layout needs session connections for its sweep, not WithTransactionPooler or WithQueryExecMode", store.ErrInvalid)
	case strings.Contains(s.schema+s.table, "$idemkey$"):
		return fmt.Errorf("idemkey/store/postgres: %w: names containing $idemkey$ cannot be used with the partitioned layout", store.ErrInvalid)
	}
	t := s.qualified
	s.claimSQL = `SELECT * FROM ` + s.ident(s.table+"_claim") + `($1, $2, $3, $4, $5, $6)`
	s.completeSQL = fmt.Sprintf(partCompleteSQL+notifyReturning, t, s.channel)
	s.completeOnceSQL = fmt.Sprintf(partCompleteOnceSQL+notifyReturning, t, s.channel)
	s.releaseSQL = fmt.Sprintf(partReleaseSQL+notifyReturning, t, s.channel)
	s.renewSQL = fmt.Sprintf(partRenewSQL, t)
	return nil
}

// The holder statements of the partitioned layout: those of the plain layout with
// liveness judged on clock_timestamp() (see expiredFn in the migration).
var (
	partCompleteSQL     = onClockTimestamp(completeSQL)
	partCompleteOnceSQL = onClockTimestamp(completeOnceSQL)
	partReleaseSQL      = onClockTimestamp(releaseSQL)
	partRenewSQL        = onClockTimestamp(renewSQL)
)

// onClockTimestamp returns stmt with now() replaced by clock_timestamp().
func onClockTimestamp(stmt string) string {
	return strings.ReplaceAll(stmt, "now()", "clock_timestamp()")
}

// layoutMigrations returns the migrations of the store's layout.
func (s *Store) layoutMigrations() ([]migrate.Migration, error) {
	if s.part == nil {
		return migrations()
	}
	return migrate.Load(partitionedFiles, "migrations_partitioned")
}

// renderLayout renders the placeholders of the store's layout's migrations.
func (s *Store) renderLayout(sql string) string {
	if s.part == nil {
		return s.render(sql)
	}
	return s.part.render(sql)
}

// renderPartitioned renders the partitioned layout's placeholders, then the
// plain ones.
func (p *partitioned) render(sql string) string {
	s := p.s
	return strings.NewReplacer(
		"{{id_index}}", pgx.Identifier{s.table + "_id_idx"}.Sanitize(),
		"{{epoch_comment}}", literal(epochComment+strconv.FormatInt(int64(p.epoch/time.Second), 10)),
		"{{epoch_seconds}}", strconv.FormatInt(int64(p.epoch/time.Second), 10),
		"{{claim_fn}}", s.ident(s.table+"_claim"),
		"{{ensure_fn}}", s.ident(s.table+"_ensure"),
		"{{expired_fn}}", s.ident(s.table+"_expired"),
		"{{drop_detached_fn}}", s.ident(s.table+"_drop_detached"),
		"{{detached_comment}}", literal(p.detachedComment()),
		"{{lock_class}}", strconv.FormatInt(int64(p.lockClass()), 10),
		"{{key_lock_base}}", strconv.FormatInt(int64(p.lockClass())<<32, 10),
		"{{table_literal}}", literal(s.qualified),
		"{{part_prefix}}", literal(s.table+"_p"),
	).Replace(s.render(sql))
}

// lockClass identifies the store's table in its advisory locks: the first of the
// two int4 keys of the table-level locks (partition creation 0, the sweep 1), and
// the high half of the bigint key of each idempotency key's lock (see migration
// 0002: the two forms never collide).
func (p *partitioned) lockClass() int32 {
	s := p.s
	h := fnv.New32a()
	h.Write([]byte(s.qualified))
	return int32(h.Sum32())
}

// detachedComment is the comment the sweep puts on a partition just before it
// detaches it: the mark by which a later sweep knows a detached table left over
// (a sweep stopped before its DROP TABLE) as its own.
func (p *partitioned) detachedComment() string {
	s := p.s
	return "idemkey partitioned layout: detached by the sweep of " + s.qualified + ", to drop"
}

// literal quotes v as an SQL string literal.
func literal(v string) string { return "'" + strings.ReplaceAll(v, "'", "''") + "'" }

const layoutSQL = `SELECT c.relkind::text, obj_description(c.oid, 'pg_class') FROM pg_class c WHERE `

// checkLayout fails when the records table exists in the other layout, or
// partitioned by another epoch. Migrate runs it before any migration.
func (s *Store) checkLayout(ctx context.Context, q migrate.Querier) error {
	var kind, comment *string
	// With a schema, the catalogs are read by name, not through to_regclass: a
	// lookup of a schema not created yet would leave this connection a cached
	// "no such schema" that Migrate's CREATE SCHEMA IF NOT EXISTS, serialised by
	// an advisory lock (which does not refresh the caches), could believe.
	sql, args := layoutSQL+`c.oid = to_regclass($1)`, []any{s.qualified}
	if s.schema != "" {
		sql, args = layoutSQL+`c.relname = $1 AND c.relnamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = $2)`, []any{s.table, s.schema}
	}
	err := q.QueryRow(ctx, sql, args...).Scan(&kind, &comment)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // no table yet
	}
	if err != nil {
		return fmt.Errorf("read the layout: %w", err)
	}
	partitioned := kind != nil && *kind == "p"
	var epoch time.Duration
	if s.part != nil {
		epoch = s.part.epoch
	}
	want := epochComment + strconv.FormatInt(int64(epoch/time.Second), 10)
	switch {
	case epoch == 0 && partitioned:
		return fmt.Errorf("%w: table %s has the partitioned layout; configure the store WithPartitions as it was created", store.ErrInvalid, s.qualified)
	case epoch > 0 && !partitioned:
		return fmt.Errorf("%w: table %s has the plain layout; WithPartitions needs a new table (WithTable), it does not convert one", store.ErrInvalid, s.qualified)
	case epoch > 0 && (comment == nil || *comment != want):
		got := "none"
		if comment != nil {
			got = *comment
		}
		return fmt.Errorf("%w: table %s is partitioned by another epoch (%q), the store is configured with %v", store.ErrInvalid, s.qualified, got, epoch)
	}
	return nil
}

// ensurePartitions creates the partitions of the current epoch and the next
// ones that are missing, returning how many it created.
func (p *partitioned) ensure(ctx context.Context, q migrate.Querier) (int, error) {
	s := p.s
	var n int
	err := q.QueryRow(ctx, `SELECT `+s.ident(s.table+"_ensure")+`($1)`, partitionsAhead).Scan(&n)
	return n, err
}

// partitionMissing tells whether err is a claim's insert finding no partition for
// the current epoch (no sweep ran for an epoch or more); it then creates the
// partitions, so the claim can run again.
func (p *partitioned) missing(ctx context.Context, err error) bool {
	s := p.s
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" || !strings.Contains(pe.Message, "no partition") {
		return false
	}
	if _, err := p.ensure(ctx, s.db); err != nil {
		s.log().Warn("idemkey/store/postgres: creating the current epoch's partition failed", "table", s.qualified, "err", err)
		return false
	}
	return true
}

// claim is Claim in the partitioned layout: one call of the claim function,
// which reads the key's row itself and decides under the key's advisory lock, so
// it always returns one row; its only "again" is an insert that found no
// partition for the current epoch (no sweep ran for an epoch or more), after the
// partitions were created.
func (p *partitioned) claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	s := p.s
	return s.claimLoop(ctx, req, "claim", func(tok store.Token, args []any) (store.ClaimResult, bool, error) {
		var r claimRow
		err := r.scan(s.db.QueryRow(ctx, s.claimSQL, s.withMode(args...)...))
		switch {
		case err != nil && p.missing(ctx, err):
			return store.ClaimResult{}, true, nil
		case err != nil:
			return store.ClaimResult{}, false, fmt.Errorf("idemkey/store/postgres: claim: %w", poolerErr(err))
		}
		res, err := s.decide(&r, req, tok)
		return res, false, err
	})
}
