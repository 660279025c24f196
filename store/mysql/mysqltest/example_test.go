package mysqltest_test

import (
	"testing"

	"github.com/idemkey/idemkey/store/mysql/mysqltest"
)

// A test of another module gets a migrated store in a table of its own on the
// server of MYSQL_DSN (skipped without it, failed with CI=true).
func ExampleStore() {
	_ = func(t *testing.T) {
		st := mysqltest.Store(t, mysqltest.DB(t))
		_ = st // dropped, with its table, when the test ends
	}
}
