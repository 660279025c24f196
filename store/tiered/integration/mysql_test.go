package tiered_test

import (
	"testing"

	"github.com/idemkey/idemkey/store/mysql/mysqltest"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/storetest"
	"github.com/idemkey/idemkey/store/tiered"
)

// TestConformanceMySQL runs the suite with MySQL/MariaDB (MYSQL_DSN) as the
// backstop behind shared Redis, each subtest in its own key prefix and table.
func TestConformanceMySQL(t *testing.T) {
	c := redistest.Shared(t)
	db := mysqltest.DB(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
		t.Cleanup(fast.StopWaiters)
		return storetest.Subject{Store: mustTiered(t, fast, mysqltest.Store(t, db), tiered.WithTimeout(testTimeout))}
	})
}

// TestWaitingMySQL runs the middleware's waiting duplicates over Redis in front
// of MySQL: the Redis subscription or the backstop's polling wakes them.
func TestWaitingMySQL(t *testing.T) {
	c := redistest.Shared(t)
	db := mysqltest.DB(t)
	storetest.RunWaiting(t, func(t *testing.T) storetest.WaitSubject {
		fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)), redis.WithWaiterIdle(0))
		t.Cleanup(fast.StopWaiters)
		return storetest.WaitSubject{Store: mustTiered(t, fast, mysqltest.Store(t, db), tiered.WithTimeout(testTimeout)),
			Waiting: func() int { return int(fast.Stats().Waiters) }}
	})
}
