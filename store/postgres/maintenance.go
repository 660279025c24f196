// The records' upkeep: the sweeper and the schema migrations.

package postgres

import (
	"context"
	"embed"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/store/postgres/internal/migrate"
	"github.com/idemkey/idemkey/store/sweep"
)

// Sweep deletes records past their retention, at most limit of them (limit <= 0:
// all), in statements of at most the sweep batch size (WithSweepBatch), each its own
// short transaction that skips rows locked by a concurrent claim. It returns how
// many rows it deleted. Claim already treats expired records as absent, so sweeping
// only reclaims space; run it from a cron job or StartSweeper. On a driver error it
// returns the rows deleted so far and the error, wrapped.
func (s *Store) Sweep(ctx context.Context, limit int) (int64, error) {
	if s.part != nil {
		return s.part.sweep(ctx) // partition_sweep.go
	}
	var total int64
	for limit <= 0 || total < int64(limit) {
		n := int64(s.sweepBatch)
		if limit > 0 {
			n = min(n, int64(limit)-total)
		}
		tag, err := s.exec(ctx, s.sweepSQL, n)
		if err != nil {
			return total, fmt.Errorf("idemkey/store/postgres: sweep: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < n {
			break
		}
	}
	return total, nil
}

// StartSweeper runs Sweep(ctx, 0) every interval (1 minute if interval <= 0) in a
// goroutine until ctx is done or stop is called; stop waits for the goroutine to
// end. Failures are logged (WithLogger) and retried at the next tick.
func (s *Store) StartSweeper(ctx context.Context, interval time.Duration) (stop func()) {
	return sweep.Start(ctx, interval, func(ctx context.Context) (int64, error) { return s.Sweep(ctx, 0) },
		s.log(), "idemkey/postgres", "table", s.qualified)
}

func (s *Store) log() *slog.Logger {
	if s.logger != nil {
		return s.logger
	}
	return slog.Default()
}

// SchemaVersion is the newest schema version this build's Migrate installs.
const SchemaVersion = 2

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrations returns the embedded migrations in version order; their SQL has
// {{table}} and {{expires_index}} placeholders.
func migrations() ([]migrate.Migration, error) { return migrate.Load(migrationFiles, "migrations") }

func (s *Store) target() migrate.Target { return migrate.Target{Schema: s.schema, Table: s.table} }

func (s *Store) render(sql string) string {
	return strings.NewReplacer(
		"{{table}}", s.qualified,
		"{{expires_index}}", pgx.Identifier{s.table + "_expires_at_idx"}.Sanitize(),
	).Replace(sql)
}

// MigrationSQL returns the SQL that Migrate applies, rendered for the store's table
// and schema names, for users who run their own migration tool. It does not
// include Migrate's bookkeeping table. Every statement is idempotent.
func (s *Store) MigrationSQL() string {
	ms, err := s.layoutMigrations()
	if err != nil {
		return "-- " + err.Error()
	}
	sql := migrate.SQL(s.target(), ms, s.renderLayout)
	if s.part != nil {
		sql += "-- the partitions of the current and next epochs (Sweep keeps creating them)\nSELECT " +
			s.ident(s.table+"_ensure") + "(" + strconv.Itoa(partitionsAhead) + ");\n"
	}
	return sql
}

type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate brings the store's schema to SchemaVersion: it creates the schema (if one
// is configured), the bookkeeping table "<table>_migrations" (version, applied_at)
// and applies the embedded migrations not yet recorded there. It is idempotent and
// safe to run from several processes at once: when the Querier can Begin (a pool,
// a connection, a transaction) everything runs in one transaction serialised by an
// advisory lock on the schema name (the table name when no schema is configured);
// otherwise the statements run one by one (each is idempotent on its own, but two
// processes creating the same object at the same instant may see a unique
// violation, so run Migrate once, or retry it). A database at a newer version is left as it is; a
// records table dropped by hand is created again. Behind a transaction pooler
// the store was not configured for, it fails with ErrTransactionPooler. First it
// reads the server's replication settings (Replication): it logs one warning when
// commits do not wait for a synchronous standby, or fails with ErrNotSynchronous
// under WithSynchronousStandby (replication.go).
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.checkReplication(ctx); err != nil {
		return err
	}
	return poolerErr(s.migrate(ctx))
}

func (s *Store) migrate(ctx context.Context) (err error) {
	ms, err := s.layoutMigrations()
	if err != nil {
		return fmt.Errorf("idemkey/store/postgres: migrate: %w", err)
	}
	q := migrate.Querier(modeQuerier{s.db, s})
	if err = s.checkLayout(ctx, q); err != nil { // partition.go; outside the transaction, whose first statement is the lock
		return fmt.Errorf("idemkey/store/postgres: migrate: %w", err)
	}
	var tx pgx.Tx
	if b, ok := s.db.(beginner); ok {
		if tx, err = b.Begin(ctx); err != nil {
			return fmt.Errorf("idemkey/store/postgres: migrate: %w", err)
		}
		defer func() {
			if err != nil {
				_ = tx.Rollback(context.WithoutCancel(ctx))
			}
		}()
		q = modeQuerier{tx, s}
	}
	if err = migrate.Apply(ctx, q, tx != nil, s.target(), ms, s.renderLayout); err != nil {
		return fmt.Errorf("idemkey/store/postgres: migrate: %w", err)
	}
	if s.part != nil {
		if _, err = s.part.ensure(ctx, q); err != nil {
			return fmt.Errorf("idemkey/store/postgres: migrate: create partitions: %w", err)
		}
	}
	if tx != nil {
		if err = tx.Commit(ctx); err != nil {
			return fmt.Errorf("idemkey/store/postgres: migrate: commit: %w", err)
		}
	}
	return nil
}
