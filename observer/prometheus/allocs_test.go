//go:build !race

package idemprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/middleware"
	idemprom "github.com/idemkey/idemkey/observer/prometheus"
)

// TestObserveAllocs: observing a request allocates nothing, once each status
// was seen (the race detector's instrumentation allocates, hence !race).
func TestObserveAllocs(t *testing.T) {
	obs, err := idemprom.NewObserver(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	events := []middleware.Event{
		{Decision: middleware.Executed, Status: 201, StoreLatency: time.Millisecond, InTransaction: true},
		{Decision: middleware.Replayed, Status: 201, StoreLatency: time.Millisecond, Waited: time.Millisecond},
		{Decision: middleware.Released, Status: 503, StoreLatency: time.Millisecond, Takeover: true},
		{Decision: middleware.PassThrough},
	}
	for _, e := range events {
		obs.Observe(ctx, e) // first sight of a status creates its series
	}
	if n := testing.AllocsPerRun(100, func() {
		for _, e := range events {
			obs.Observe(ctx, e)
		}
	}); n != 0 {
		t.Errorf("Observe allocates %v times per round, want 0", n)
	}
}
