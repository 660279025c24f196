package tiered_test

import (
	"testing"

	"github.com/idemkey/idemkey/store/dynamodb/dynamotest"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/storetest"
	"github.com/idemkey/idemkey/store/tiered"
)

// TestConformanceDynamoDB runs the suite with DynamoDB (DYNAMODB_ENDPOINT) as
// the backstop behind shared Redis, each subtest in its own key prefix, in a
// table of the test's own. Bodies over DynamoDB's item limit round trip here:
// the replay comes from the Redis copy, filled with the whole response, while
// DynamoDB keeps it omitted (docs/stores.md: set the middleware's storage cap
// under dynamodb.MaxBody so both agree).
func TestConformanceDynamoDB(t *testing.T) {
	c := redistest.Shared(t)
	db := dynamotest.Client(t, nil)
	table := dynamotest.Table(t, db)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)))
		t.Cleanup(fast.StopWaiters)
		return storetest.Subject{Store: mustTiered(t, fast, dynamotest.Store(t, db, table), tiered.WithTimeout(testTimeout))}
	})
}

// TestWaitingDynamoDB runs the middleware's waiting duplicates over Redis in
// front of DynamoDB: the Redis subscription or the backstop's polling wakes
// them.
func TestWaitingDynamoDB(t *testing.T) {
	c := redistest.Shared(t)
	db := dynamotest.Client(t, nil)
	table := dynamotest.Table(t, db)
	storetest.RunWaiting(t, func(t *testing.T) storetest.WaitSubject {
		fast := mustRedis(t, c, redis.WithPrefix(redistest.Prefix(t, c)), redis.WithWaiterIdle(0))
		t.Cleanup(fast.StopWaiters)
		return storetest.WaitSubject{Store: mustTiered(t, fast, dynamotest.Store(t, db, table), tiered.WithTimeout(testTimeout)),
			Waiting: func() int { return int(fast.Stats().Waiters) }}
	})
}
