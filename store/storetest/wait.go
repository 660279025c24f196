package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// waitTimeout bounds a Wait the suite expects to be woken: far longer than a
// notification takes, so a Wait that was not woken fails with DeadlineExceeded.
const waitTimeout = 10 * time.Second

// waiter returns s.Store as a store.Waiter, or skips the test.
func (s *suite) waiter(t *testing.T) store.Waiter {
	w, ok := s.Store.(store.Waiter)
	if !ok {
		t.Skip("the store does not implement store.Waiter")
	}
	return w
}

// testWaitNoLiveClaim: Wait returns nil at once for a key without a live claim:
// absent, completed, or whose lease expired.
func testWaitNoLiveClaim(t *testing.T, s *suite) {
	w := s.waiter(t)
	absent := newID(t)
	completed := newID(t)
	tok := s.mustClaim(t, longReq(completed, fpA))
	s.complete(t, completed, tok, sampleResponse())
	expired := newID(t)
	s.mustClaim(t, req(expired, fpA))
	s.Wait(Lease + slack)
	for name, id := range map[string]store.ID{"absent": absent, "completed": completed, "expired": expired} {
		ctx, cancel := context.WithTimeout(s.ctx, waitTimeout)
		err := w.Wait(ctx, id)
		cancel()
		if err != nil {
			t.Errorf("Wait on the %s key = %v, want nil at once", name, err)
		}
	}
	// Waiting changed nothing.
	s.expect(t, req(completed, fpA), store.Completed)
	s.expect(t, req(absent, fpA), store.Claimed)
}

// testWaitBlocksInFlight: while the claim stays in flight untouched, Wait blocks
// until its context ends and returns the context's error; the claim is unchanged.
func testWaitBlocksInFlight(t *testing.T, s *suite) {
	w := s.waiter(t)
	id := newID(t)
	tok := s.mustClaim(t, longReq(id, fpA))
	ctx, cancel := context.WithTimeout(s.ctx, 100*time.Millisecond)
	err := w.Wait(ctx, id)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a claim in flight = %v, want context.DeadlineExceeded", err)
	}
	ctx, cancel = context.WithCancel(s.ctx)
	done := make(chan error, 1)
	go func() { done <- w.Wait(ctx, id) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Wait = %v, want context.Canceled", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("cancelled Wait did not return")
	}
	s.expect(t, req(id, fpA), store.InFlight)
	s.complete(t, id, tok, sampleResponse())
	equalResponse(t, s.expect(t, req(id, fpA), store.Completed).Record, sampleResponse())
}

// testWaitWakes: every waiter of a key is woken (nil) when the holder completes
// or releases the claim, or an operator evicts it (store.Inspector), long before
// its own deadline.
func testWaitWakes(t *testing.T, s *suite) {
	w := s.waiter(t)
	for _, end := range []string{"complete", "release", "evict"} {
		t.Run(end, func(t *testing.T) {
			ins, canEvict := s.Store.(store.Inspector)
			if end == "evict" && !canEvict {
				t.Skip("the store does not implement store.Inspector")
			}
			id := newID(t)
			tok := s.mustClaim(t, longReq(id, fpA))
			const n = 8
			errs := make(chan error, n)
			var started sync.WaitGroup
			for range n {
				started.Add(1)
				go func() {
					started.Done()
					ctx, cancel := context.WithTimeout(s.ctx, waitTimeout)
					defer cancel()
					errs <- w.Wait(ctx, id)
				}()
			}
			started.Wait()
			// Registration cannot be observed through the interface; give the
			// waiters a moment to register so the notification path is the one
			// exercised (a Wait that registers after the end returns nil too).
			time.Sleep(50 * time.Millisecond)
			t0 := time.Now()
			switch end {
			case "complete":
				s.complete(t, id, tok, sampleResponse())
			case "release":
				if err := s.Store.Release(s.ctx, id, tok); err != nil {
					t.Fatalf("Release: %v", err)
				}
			case "evict":
				if _, evicted, err := ins.Evict(s.ctx, id, store.EvictAny); err != nil || !evicted {
					t.Fatalf("Evict: %v %v", evicted, err)
				}
			}
			for range n {
				if err := <-errs; err != nil {
					t.Fatalf("Wait after %s = %v, want nil", end, err)
				}
			}
			if d := time.Since(t0); d > waitTimeout/2 {
				t.Errorf("waiters woken %v after the %s", d, end)
			}
			if end == "complete" {
				s.expect(t, req(id, fpA), store.Completed)
			} else {
				s.expect(t, req(id, fpA), store.Claimed)
			}
		})
	}
}
