package celeriantsim_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
)

// TestDefaultCommitDelay: a simulator with zero Options keeps each write in flight for
// DefaultCommitDelay, a few milliseconds as on the server (docs/celeriant-protocol.md
// section 6.5): a concurrent duplicate gets 2013, not 2002, and reads do not see the
// write until the window has passed; Settled reports the end of the window.
// NoCommitDelay commits at once.
func TestDefaultCommitDelay(t *testing.T) {
	if d := celeriantsim.DefaultCommitDelay; d < time.Millisecond || d > 10*time.Millisecond {
		t.Fatalf("DefaultCommitDelay = %v, want a few ms", d)
	}
	synctest.Test(t, func(t *testing.T) {
		sim := celeriantsim.New(celeriantsim.Options{})
		defer sim.Close()
		k, c := key(), uuid.New()
		first := make(chan error, 1)
		go func() { _, err := sim.Write(ctx, wr(c, aw(k, nil, true, evt(1)))); first <- err }()
		synctest.Wait() // the first write is prepared and waits for its commit
		_, err := sim.Write(ctx, wr(c, aw(k, nil, true, evt(1))))
		code(t, err, celeriant.CodeWriteInflightDuplicate)
		_, err = sim.AggregateDetails(ctx, k)
		code(t, err, celeriant.CodeExistsAggregateNotFound)
		select {
		case <-sim.Settled():
			t.Fatal("Settled with a write in flight")
		default:
		}
		start := time.Now()
		ok(t, <-first)
		<-sim.Settled()
		if waited := time.Since(start); waited != celeriantsim.DefaultCommitDelay {
			t.Fatalf("committed after %v, want %v", waited, celeriantsim.DefaultCommitDelay)
		}
		if d, err := sim.AggregateDetails(ctx, k); err != nil || d.MaxVersion != 1 {
			t.Fatalf("after the window: %+v, %v", d, err)
		}
		_, err = sim.Write(ctx, wr(c, aw(k, nil, true, evt(1))))
		code(t, err, celeriant.CodeWriteClientIdempotency)
	})
	synctest.Test(t, func(t *testing.T) {
		sim := celeriantsim.New(celeriantsim.Options{CommitDelay: celeriantsim.NoCommitDelay})
		defer sim.Close()
		k, c := key(), uuid.New()
		start := time.Now()
		_, err := sim.Write(ctx, wr(c, aw(k, nil, true, evt(1))))
		ok(t, err)
		if time.Since(start) != 0 {
			t.Fatal("NoCommitDelay waited")
		}
		_, err = sim.Write(ctx, wr(c, aw(k, nil, true, evt(1))))
		code(t, err, celeriant.CodeWriteClientIdempotency)
	})
}
