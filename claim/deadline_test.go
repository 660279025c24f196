package claim_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

type ctxKey struct{}

// hungStore answers no claim: it waits for the claim's context, then reports
// what it saw of it.
type hungStore struct {
	store.Store
	mu   sync.Mutex
	seen []hungClaim
}

type hungClaim struct {
	value    any
	deadline time.Time
	cause    error
}

func (s *hungStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	derived, cancel := context.WithCancel(ctx) // as a client may: it must end with ctx
	defer cancel()
	<-derived.Done()
	dl, _ := ctx.Deadline()
	s.mu.Lock()
	s.seen = append(s.seen, hungClaim{value: ctx.Value(ctxKey{}), deadline: dl, cause: context.Cause(derived)})
	s.mu.Unlock()
	return store.ClaimResult{}, ctx.Err()
}

// Claims on a context that is never cancelled (the middleware's, Fiber's)
// share their deadlines (no timer per claim), and each still fails within its
// bound and no sooner than a hundredth of it before: claims sent at scattered
// times against a hung store, each with its own context values.
func TestClaimDeadlineWithinBound(t *testing.T) {
	for _, bound := range []time.Duration{time.Millisecond, 333 * time.Millisecond, 5 * time.Second} {
		synctest.Test(t, func(t *testing.T) {
			st := &hungStore{Store: memory.New()}
			cl, err := claim.New(claim.Config{Store: notInProcess{st}, Lease: time.Second, Retention: time.Hour,
				Logger: quiet, Timeouts: claim.Timeouts{Claim: bound}})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, uint64(bound)))
			var wg sync.WaitGroup
			for i := range 40 {
				time.Sleep(time.Duration(rng.Int64N(int64(bound / 20))))
				wg.Go(func() {
					parent := context.WithValue(context.Background(), ctxKey{}, i)
					t0 := time.Now()
					_, _, err := cl.Claim(parent, store.ClaimRequest{ID: store.ID{Key: "k"}})
					took := time.Since(t0)
					if !errors.Is(err, context.DeadlineExceeded) || took > bound || took <= bound-bound/100 {
						t.Errorf("claim %d: %v after %v; want a deadline within (%v, %v]", i, err, took, bound-bound/100, bound)
					}
				})
			}
			wg.Wait()
			seen := map[any]bool{}
			for _, c := range st.seen {
				seen[c.value] = true
				if !errors.Is(c.cause, context.DeadlineExceeded) || c.deadline.IsZero() {
					t.Errorf("claim %v: derived context ended with %v, deadline %v", c.value, c.cause, c.deadline)
				}
			}
			if len(seen) != 40 {
				t.Errorf("the store saw the values of %d claims' contexts, want 40", len(seen))
			}
		})
	}
}

// A claim's bound on a context that is never cancelled costs one allocation
// (the claim's view of the shared deadline), not a context and a timer each.
func TestClaimDeadlineAllocs(t *testing.T) {
	st := memory.New()
	cl, err := claim.New(claim.Config{Store: notInProcess{st}, Lease: time.Second, Retention: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := store.ID{Key: "k"}
	res, _, err := cl.Claim(ctx, store.ClaimRequest{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, id, res.Token, store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if res, _, err := cl.Claim(ctx, store.ClaimRequest{ID: id}); err != nil || res.Outcome != store.Completed {
			t.Fatal(res, err)
		}
	})
	if allocs > 1 {
		t.Errorf("a replay's claim allocates %v times, want 1", allocs)
	}
}
