package redis

import (
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// NewForTest is New for a test: a construction error fails tb.
func NewForTest(tb testing.TB, c goredis.UniversalClient, opts ...Option) *Store {
	tb.Helper()
	s, err := New(c, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}
