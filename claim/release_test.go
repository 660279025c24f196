package claim_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// lostAnswers is a store that hangs while down: a claim sent then gets no answer
// before its deadline, but lands once the store is back (as a SIGSTOPped server
// runs the statement when it resumes); releases sent while down fail.
type lostAnswers struct {
	store.Store
	down     atomic.Bool
	back     chan struct{} // closed when the store is up again
	releases atomic.Int32
}

func (s *lostAnswers) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if !s.down.Load() {
		return s.Store.Claim(ctx, req)
	}
	<-ctx.Done()
	go func() {
		<-s.back
		_, _ = s.Store.Claim(context.Background(), req) // the claim lands after its answer was lost
	}()
	return store.ClaimResult{}, ctx.Err()
}

func (s *lostAnswers) Release(ctx context.Context, id store.ID, tok store.Token) error {
	s.releases.Add(1)
	if s.down.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Release(ctx, id, tok)
}

// A claim whose answer was lost does not hold its key: it is released, fenced by
// its token (generated before the send), once the store answers again, so a
// retry runs within a second of the recovery, not after the lease.
func TestLostClaimReleasedAfterRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &lostAnswers{Store: memory.New(), back: make(chan struct{})}
		st.down.Store(true)
		cl, err := claim.New(claim.Config{Store: notInProcess{st}, Lease: 10 * time.Second, Retention: time.Hour,
			Logger: quiet, Timeouts: claim.Timeouts{Claim: time.Second, Release: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		id := store.ID{Key: "k"}
		if _, _, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("claim against a hung store: %v, want a deadline", err)
		}
		time.Sleep(3 * time.Second) // the outage goes on; background releases fail
		st.down.Store(false)
		close(st.back)
		synctest.Wait()
		res, err := st.Store.Claim(t.Context(), store.ClaimRequest{ID: id, Lease: time.Second, Retention: time.Hour})
		if err != nil || res.Outcome != store.InFlight {
			t.Fatalf("just after recovery: %+v, %v; want the late claim in flight", res, err)
		}
		time.Sleep(time.Second)
		res, _, err = cl.Claim(t.Context(), store.ClaimRequest{ID: id})
		if err != nil || res.Outcome != store.Claimed || res.Takeover {
			t.Fatalf("retry a second after recovery: %+v, %v; want a fresh claim (the late one released)", res, err)
		}
		if n := st.releases.Load(); n < 2 || n > 10 {
			t.Errorf("%d release calls, want a few (bounded, with back-off)", n)
		}
	})
}

// failingRelease fails its first releases (a restart), then works.
type failingRelease struct {
	store.Store
	fail atomic.Int32
}

func (s *failingRelease) Release(ctx context.Context, id store.ID, tok store.Token) error {
	if s.fail.Add(-1) >= 0 {
		return errors.New("connection refused")
	}
	return s.Store.Release(ctx, id, tok)
}

// A release that failed is retried in the background, fenced by the token.
func TestFailedReleaseRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &failingRelease{Store: memory.New()}
		st.fail.Store(3)
		cl := newClaimer(t, st, 10*time.Second)
		id := store.ID{Key: "k"}
		res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
		if err != nil || res.Outcome != store.Claimed {
			t.Fatal(res, err)
		}
		var e claim.Execution
		e.Start(cl, t.Context(), id, res.Token, sent, nil)
		e.Stop()
		if err := e.Release(); err == nil {
			t.Fatal("first release succeeded")
		}
		time.Sleep(time.Second)
		if res, _, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id}); err != nil || res.Outcome != store.Claimed {
			t.Fatalf("claim a second after a failed release: %+v, %v; want claimed", res, err)
		}
	})
}
