package mysql_test

import (
	"testing"

	"github.com/idemkey/idemkey/store/mysql/mysqltest"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestConformance runs the whole store contract suite (including the Inspector
// and Wait sections) against MYSQL_DSN, each subtest in a table of its own.
func TestConformance(t *testing.T) {
	db := mysqltest.DB(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: mysqltest.Store(t, db)}
	})
}

// TestWaiting runs the middleware's waiting duplicates over the store's polling
// Wait.
func TestWaiting(t *testing.T) {
	db := mysqltest.DB(t)
	storetest.RunWaiting(t, func(t *testing.T) storetest.WaitSubject {
		return storetest.WaitSubject{Store: mysqltest.Store(t, db)}
	})
}
