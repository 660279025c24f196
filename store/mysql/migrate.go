package mysql

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// SchemaVersion is the newest schema version this build's Migrate installs.
const SchemaVersion = 1

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one embedded file, migrations/NNNN_name.sql: its version and its
// statements (separated by a semicolon at the end of a line), with the
// {{table}} and {{expires_index}} placeholders.
type migration struct {
	version    int
	statements []string
}

func loadMigrations() ([]migration, error) {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, name := range names {
		v, err := strconv.Atoi(strings.SplitN(path.Base(name), "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("migration %s: no version prefix", name)
		}
		text, err := migrationFiles.ReadFile(name)
		if err != nil {
			return nil, err
		}
		m := migration{version: v}
		for _, st := range strings.Split(string(text), ";\n") {
			if st = strings.TrimSpace(st); st != "" && !onlyComments(st) {
				m.statements = append(m.statements, st)
			}
		}
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

func onlyComments(st string) bool {
	for _, line := range strings.Split(st, "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "--") {
			return false
		}
	}
	return true
}

func (s *Store) render(sql string) string {
	return strings.NewReplacer("{{table}}", s.quoted, "{{expires_index}}", quote(s.table+"_expires_at_idx")).Replace(sql)
}

// MigrationSQL returns the SQL that Migrate applies, rendered for the store's
// table name, for users who run their own migration tool. It does not include
// Migrate's bookkeeping table. Every statement is idempotent.
func (s *Store) MigrationSQL() string {
	ms, err := loadMigrations()
	if err != nil {
		return "-- " + err.Error()
	}
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "-- version %d\n", m.version)
		for _, st := range m.statements {
			b.WriteString(s.render(st) + ";\n")
		}
	}
	return b.String()
}

// Migrate brings the store's table to SchemaVersion: it creates the bookkeeping
// table "<table>_migrations" (version, applied_at) and applies the embedded
// migrations not yet recorded there. It is idempotent and safe to run from
// several processes at once: it holds a named lock (GET_LOCK, per database and
// table, waiting up to 60 s) on one connection while it works, because DDL
// statements commit on their own and cannot share a transaction. A database at
// a newer version is left as it is. On a Galera node without causal reads it
// changes nothing and returns ErrGaleraSyncWait (galera.go). Errors are the
// driver's, wrapped.
func (s *Store) Migrate(ctx context.Context) (err error) {
	ms, err := loadMigrations()
	if err != nil {
		return fmt.Errorf("idemkey/store/mysql: migrate: %w", err)
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idemkey/store/mysql: migrate: %w", err)
	}
	defer conn.Close()
	if err := checkGalera(ctx, conn); err != nil { // galera.go
		return err
	}
	lock := `CONCAT('idemkey_', LEFT(SHA2(CONCAT(DATABASE(), '.', ?), 256), 40))`
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(`+lock+`, 60)`, s.table).Scan(&got); err != nil {
		return fmt.Errorf("idemkey/store/mysql: migrate: lock: %w", err)
	}
	if got.Int64 != 1 {
		return fmt.Errorf("idemkey/store/mysql: migrate: another process held the migration lock of %s for 60 s", s.quoted)
	}
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(`+lock+`)`, s.table) }()
	book := quote(s.table + "_migrations")
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+book+
		` (version INT NOT NULL PRIMARY KEY, applied_at DATETIME(6) NOT NULL) ENGINE = InnoDB`); err != nil {
		return fmt.Errorf("idemkey/store/mysql: migrate: %w", err)
	}
	var current sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT MAX(version) FROM `+book).Scan(&current); err != nil {
		return fmt.Errorf("idemkey/store/mysql: migrate: %w", err)
	}
	for _, m := range ms {
		if int64(m.version) <= current.Int64 {
			continue
		}
		for _, st := range m.statements {
			if _, err := conn.ExecContext(ctx, s.render(st)); err != nil {
				return fmt.Errorf("idemkey/store/mysql: migrate: version %d: %w", m.version, err)
			}
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO `+book+` (version, applied_at) VALUES (?, `+now+`)`, m.version); err != nil {
			return fmt.Errorf("idemkey/store/mysql: migrate: version %d: %w", m.version, err)
		}
	}
	return nil
}
