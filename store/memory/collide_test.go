package memory

import (
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestConformanceSharedHash runs the store suite with every ID under one hash,
// so each record is found, replaced and removed through the chain of records
// sharing it.
func TestConformanceSharedHash(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		c := testclock.New(time.Unix(1_700_000_000, 0))
		s := New(WithClock(c.Now), WithShards(1))
		s.hashMask = 0
		return storetest.Subject{Store: s, Wait: c.Add}
	})
}
