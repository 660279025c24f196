// Package migrate applies the embedded, numbered SQL migrations of the Postgres
// idempotency store and of the inbox with one bookkeeping scheme and one
// advisory lock per schema, so that the two (and any number of processes)
// serialise with each other when they migrate into the same new schema.
package migrate

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier runs statements: a pgx.Tx, a *pgxpool.Pool or a *pgx.Conn.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Migration is one embedded file, NNNN_description.sql.
type Migration struct {
	Version int
	Name    string
	SQL     string // with the caller's {{placeholders}}
}

// Load returns the migrations in dir of fsys in version order (ReadDir sorts by
// name). A file name that does not start with a number is an error.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, e := range entries {
		v, err := strconv.Atoi(strings.SplitN(e.Name(), "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("migration file %q: %w", e.Name(), err)
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: e.Name(), SQL: string(b)})
	}
	return ms, nil
}

// Target names the tables one Migrate works on: its main table, in Schema (""
// for the search_path), and the bookkeeping table "<Table>_migrations" beside it.
type Target struct {
	Schema, Table string // unquoted
}

// Ident returns name quoted and qualified with the target's schema.
func (t Target) Ident(name string) string {
	if t.Schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{t.Schema, name}.Sanitize()
}

// lockKey is the advisory lock's name: the schema's when there is one (CREATE
// SCHEMA IF NOT EXISTS fails with a unique violation against a concurrent twin,
// e.g. another table migrating into the same new schema), else the table's.
func (t Target) lockKey() string {
	if t.Schema != "" {
		return "idemkey:schema:" + pgx.Identifier{t.Schema}.Sanitize()
	}
	return "idemkey:" + t.Ident(t.Table)
}

// SchemaSQL returns the statement creating the target's schema, "" without one.
func (t Target) SchemaSQL() string {
	if t.Schema == "" {
		return ""
	}
	return "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{t.Schema}.Sanitize()
}

// Apply brings target to the newest of ms through q: with inTx (q is a
// transaction the caller commits) it first takes the advisory lock for the
// target; then it creates the schema and the bookkeeping table if needed and
// runs, rendered, each migration newer than the recorded version, recording it.
// The recorded version counts only while the main table exists, so a table
// dropped by hand is created again. Errors name the step; callers add their
// own prefix.
func Apply(ctx context.Context, q Querier, inTx bool, t Target, ms []Migration, render func(string) string) error {
	if inTx {
		if _, err := q.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, t.lockKey()); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
	}
	if s := t.SchemaSQL(); s != "" {
		if _, err := q.Exec(ctx, s); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
	}
	versions := t.Ident(t.Table + "_migrations")
	if _, err := q.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+versions+` (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)`); err != nil {
		return fmt.Errorf("versions table: %w", err)
	}
	var current int
	if err := q.QueryRow(ctx, `SELECT CASE WHEN to_regclass($1) IS NULL THEN 0 ELSE coalesce(max(version), 0) END FROM `+versions,
		t.Ident(t.Table)).Scan(&current); err != nil {
		return fmt.Errorf("read version: %w", err)
	}
	for _, m := range ms {
		if m.Version <= current {
			continue
		}
		if _, err := q.Exec(ctx, render(m.SQL)); err != nil { // no arguments: simple protocol, several statements
			return fmt.Errorf("%s: %w", m.Name, err)
		}
		if _, err := q.Exec(ctx, `INSERT INTO `+versions+` (version) VALUES ($1) ON CONFLICT DO NOTHING`, m.Version); err != nil {
			return fmt.Errorf("record %s: %w", m.Name, err)
		}
	}
	return nil
}

// SQL returns every migration rendered, after the schema's statement, for users
// of their own migration tool (without the bookkeeping table).
func SQL(t Target, ms []Migration, render func(string) string) string {
	var b strings.Builder
	if s := t.SchemaSQL(); s != "" {
		b.WriteString(s + ";\n")
	}
	for _, m := range ms {
		fmt.Fprintf(&b, "-- %s\n%s", m.Name, render(m.SQL))
	}
	return b.String()
}
