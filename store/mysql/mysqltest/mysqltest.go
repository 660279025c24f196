// Package mysqltest opens the MySQL/MariaDB server of the tests (MYSQL_DSN) and
// gives each test a migrated store in a table of its own, for the tests of
// store/mysql and of the modules that run it (the tiered store's suite, the
// benchmarks).
package mysqltest

import (
	"context"
	"database/sql"
	"testing"

	driver "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
)

// DB opens MYSQL_DSN (a go-sql-driver DSN such as
// root@tcp(127.0.0.1:3306)/idemkey_test) and closes it when the test ends. Without
// MYSQL_DSN the test is skipped, unless CI=true: then it fails. configure may
// change the parsed DSN (driver options, session variables) first.
func DB(t testing.TB, configure ...func(*driver.Config)) *sql.DB {
	t.Helper()
	dsn := testenv.Getenv(t, "MYSQL_DSN", "a MySQL or MariaDB server")
	cfg, err := driver.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("MYSQL_DSN: %v", err)
	}
	for _, f := range configure {
		f(cfg)
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("MYSQL_DSN: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := db.PingContext(t.Context()); err != nil {
		t.Fatalf("MYSQL_DSN: %v", err)
	}
	return db
}

// Store returns a migrated store on db in a table of its own (random name),
// dropped with its bookkeeping table, and the store closed, when the test ends.
func Store(t testing.TB, db *sql.DB, opts ...mysql.Option) *mysql.Store {
	t.Helper()
	table := "idemkey_test_" + store.NewToken().String()[:12]
	s, err := mysql.New(db, append([]mysql.Option{mysql.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatalf("mysql.New: %v", err)
	}
	t.Cleanup(func() {
		_ = s.Close()
		if _, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+table+"`, `"+table+"_migrations`"); err != nil {
			t.Errorf("drop table %s: %v", table, err)
		}
	})
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}
