package dynamodb_test

import (
	"testing"

	"github.com/idemkey/idemkey/store/dynamodb"
	"github.com/idemkey/idemkey/store/dynamodb/dynamotest"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestConformance runs the whole store contract suite (including the Inspector
// and Wait sections) against DYNAMODB_ENDPOINT, in a table of its own.
func TestConformance(t *testing.T) {
	c := dynamotest.Client(t, nil)
	table := dynamotest.Table(t, c)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: dynamotest.Store(t, c, table), MaxBody: dynamodb.MaxItemBytes}
	})
}

// TestWaiting runs the middleware's waiting duplicates over the store's polling
// Wait.
func TestWaiting(t *testing.T) {
	c := dynamotest.Client(t, nil)
	table := dynamotest.Table(t, c)
	storetest.RunWaiting(t, func(t *testing.T) storetest.WaitSubject {
		return storetest.WaitSubject{Store: dynamotest.Store(t, c, table)}
	})
}
