package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

func testConcurrentClaim(t *testing.T, s *suite) {
	id := newID(t)
	const n = 64
	r := req(id, fpA)
	r.Lease = 10 * time.Second // nobody may take over during the storm
	r.Retention = 20 * time.Second
	if counts := s.claimStorm(t, r, n); counts[store.Claimed] != 1 || counts[store.InFlight] != n-1 {
		t.Fatalf("outcomes %v, want exactly 1 claimed and %d in flight", counts, n-1)
	}
}

// claimStorm sends n identical claims at once and counts the outcomes.
func (s *suite) claimStorm(t *testing.T, r store.ClaimRequest, n int) map[store.Outcome]int {
	t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		counts  = map[store.Outcome]int{}
		errs    []error
		barrier = make(chan struct{})
	)
	for range n {
		wg.Go(func() {
			<-barrier
			res, err := s.Store.Claim(s.ctx, r)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			counts[res.Outcome]++
		})
	}
	close(barrier)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d claims failed, first: %v", len(errs), errs[0])
	}
	return counts
}

func testConcurrentTakeover(t *testing.T, s *suite) {
	// The takeover of an expired lease is as exclusive as a first claim.
	id := newID(t)
	s.mustClaim(t, req(id, fpA))
	s.Wait(Lease + slack)
	r := req(id, fpA)
	r.Lease = 10 * time.Second
	r.Retention = 20 * time.Second
	const n = 64
	if counts := s.claimStorm(t, r, n); counts[store.Claimed] != 1 || counts[store.InFlight] != n-1 {
		t.Fatalf("outcomes %v, want exactly 1 claimed and %d in flight", counts, n-1)
	}
}
