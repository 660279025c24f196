// Package idemtest is the conformance suite of package idem over a store
// (docs/architecture.md section 10): the key cases of the store contract seen
// through idem.Do. Every backend runs it from its own tests:
//
//	func TestIdem(t *testing.T) {
//		idemtest.Run(t, func(t *testing.T) store.Store { return newEmptyStore(t) })
//	}
//
// Leases run on the store's real clock (a few hundred milliseconds), so the
// suite needs a store whose deadlines follow real time.
package idemtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/idem"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// Durations of the suite. Lease is short so the expiry cases stay fast, and
// long enough for a few round trips to a loaded server; slack absorbs clock
// granularity between the test and the store's server.
const (
	Lease     = 300 * time.Millisecond
	Retention = 10 * time.Second
	longLease = 10 * time.Second
	slack     = 100 * time.Millisecond
)

// Run runs every case against the stores open returns; open is called once per
// case and must return an empty store cleaned up with t.Cleanup.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := open(t)
			if st == nil {
				t.Fatal("idemtest: open returned a nil store")
			}
			tc.run(t, &suite{st: st, ctx: t.Context()})
		})
	}
}

var cases = []struct {
	name string
	run  func(t *testing.T, s *suite)
}{
	{"RunsOnceThenReplays", testRunsOnceThenReplays},
	{"EmptyResultReplays", testEmptyResult},
	{"InFlightTypedError", testInFlight},
	{"MismatchCompleted", testMismatchCompleted},
	{"MismatchInFlight", testMismatchInFlight},
	{"ErrorReleases", testErrorReleases},
	{"PolicyRecordsFailure", testPolicyRecordsFailure},
	{"PanicReleases", testPanicReleases},
	{"RenewalKeepsLease", testRenewal},
	{"TakeoverAfterHolderDied", testTakeover},
	{"StaleHolderNotStored", testStaleHolder},
	{"LeaseLostCancelsFn", testLeaseLostCancels},
	{"ConcurrentCallsOneRuns", testConcurrent},
	{"ScopesIsolated", testScopes},
	{"InvalidIDRefused", testInvalid},
}

type suite struct {
	st  store.Store
	ctx context.Context
}

func (s *suite) runner(t *testing.T, st store.Store, lease time.Duration, opts ...idem.Option) *idem.Runner {
	t.Helper()
	r, err := idem.New(st, append([]idem.Option{idem.WithLease(lease), idem.WithRecordRetention(policy.RetentionRule{Default: Retention})}, opts...)...)
	if err != nil {
		t.Fatalf("idem.New: %v", err)
	}
	return r
}

func newID(t *testing.T) store.ID {
	return store.ID{Scope: "idemtest-" + t.Name(), Key: "call-" + store.NewToken().String()}
}

var (
	fpA = idem.Fingerprint([]byte("args-a"))
	fpB = idem.Fingerprint([]byte("args-b"))
)

// value returns fn that counts its runs and returns v.
func value(runs *atomic.Int32, v string) idem.Func {
	return func(context.Context) ([]byte, error) {
		runs.Add(1)
		return []byte(v), nil
	}
}

func mustDo(t *testing.T, r *idem.Runner, ctx context.Context, id store.ID, fp store.Fingerprint, fn idem.Func) idem.Result {
	t.Helper()
	res, err := r.Do(ctx, id, fp, fn)
	if err != nil {
		t.Fatalf("Do(%q): %v", id.Key, err)
	}
	return res
}

func expectReplay(t *testing.T, r *idem.Runner, ctx context.Context, id store.ID, want string) {
	t.Helper()
	res, err := r.Do(ctx, id, fpA, func(context.Context) ([]byte, error) {
		t.Error("fn ran on a completed key")
		return nil, nil
	})
	if err != nil {
		t.Fatalf("replay Do: %v", err)
	}
	if !res.Replayed || string(res.Value) != want {
		t.Fatalf("replay = %q replayed=%v, want %q replayed", res.Value, res.Replayed, want)
	}
}

func testRunsOnceThenReplays(t *testing.T, s *suite) {
	r := s.runner(t, s.st, longLease)
	id := newID(t)
	var runs atomic.Int32
	res := mustDo(t, r, s.ctx, id, fpA, value(&runs, "result-1"))
	if res.Replayed || res.Takeover || string(res.Value) != "result-1" {
		t.Fatalf("first Do = %+v", res)
	}
	for range 3 {
		expectReplay(t, r, s.ctx, id, "result-1")
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
}

func testEmptyResult(t *testing.T, s *suite) {
	r := s.runner(t, s.st, longLease)
	id := newID(t)
	mustDo(t, r, s.ctx, id, fpA, func(context.Context) ([]byte, error) { return nil, nil })
	expectReplay(t, r, s.ctx, id, "")
}

// hold starts fn on id in the background; fn blocks until release is closed.
// It returns once fn runs, and a channel with Do's outcome.
func hold(t *testing.T, r *idem.Runner, ctx context.Context, id store.ID, fp store.Fingerprint, v string) (release chan struct{}, done chan error) {
	t.Helper()
	release, done, started := make(chan struct{}), make(chan error, 1), make(chan struct{})
	go func() {
		_, err := r.Do(ctx, id, fp, func(context.Context) ([]byte, error) {
			close(started)
			<-release
			return []byte(v), nil
		})
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("holder's Do returned before fn ran: %v", err)
	}
	return release, done
}

func testInFlight(t *testing.T, s *suite) {
	r := s.runner(t, s.st, longLease)
	id := newID(t)
	release, done := hold(t, r, s.ctx, id, fpA, "held")
	_, err := r.Do(s.ctx, id, fpA, func(context.Context) ([]byte, error) {
		t.Error("fn ran while another call holds the key")
		return nil, nil
	})
	var inflight *idem.InFlightError
	if !errors.As(err, &inflight) || !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("Do while in flight: %v, want *InFlightError", err)
	}
	if inflight.RetryAfter <= 0 || inflight.RetryAfter > longLease || inflight.ID != id {
		t.Fatalf("InFlightError = %+v, want RetryAfter in (0, %v] and the call's ID", inflight, longLease)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	expectReplay(t, r, s.ctx, id, "held")
}

func testMismatchCompleted(t *testing.T, s *suite) {
	r := s.runner(t, s.st, longLease)
	id := newID(t)
	var runs atomic.Int32
	mustDo(t, r, s.ctx, id, fpA, value(&runs, "a"))
	_, err := r.Do(s.ctx, id, fpB, value(&runs, "b"))
	var mm *idem.MismatchError
	if !errors.As(err, &mm) || !errors.Is(err, idem.ErrMismatch) || mm.ID != id {
		t.Fatalf("Do with another fingerprint: %v, want *MismatchError", err)
	}
	expectReplay(t, r, s.ctx, id, "a") // untouched
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
}

func testMismatchInFlight(t *testing.T, s *suite) {
	r := s.runner(t, s.st, longLease)
	id := newID(t)
	release, done := hold(t, r, s.ctx, id, fpA, "a")
	var runs atomic.Int32
	if _, err := r.Do(s.ctx, id, fpB, value(&runs, "b")); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("Do with another fingerprint while in flight: %v, want ErrMismatch", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	expectReplay(t, r, s.ctx, id, "a")
	if runs.Load() != 0 {
		t.Fatal("fn ran for a mismatched fingerprint")
	}
}

var errTransient = errors.New("idemkey/idem/idemtest: transient failure")

func testErrorReleases(t *testing.T, s *suite) {
	r := s.runner(t, s.st, longLease)
	id := newID(t)
	_, err := r.Do(s.ctx, id, fpA, func(context.Context) ([]byte, error) { return []byte("partial"), errTransient })
	if !errors.Is(err, errTransient) {
		t.Fatalf("Do: %v, want fn's error", err)
	}
	var runs atomic.Int32
	res := mustDo(t, r, s.ctx, id, fpA, value(&runs, "second"))
	if res.Replayed || runs.Load() != 1 {
		t.Fatalf("after a released failure: %+v, runs %d; want fn to run again", res, runs.Load())
	}
	expectReplay(t, r, s.ctx, id, "second")
}

var errPermanent = errors.New("idemkey/idem/idemtest: permanent failure")

func testPolicyRecordsFailure(t *testing.T, s *suite) {
	r := s.runner(t, s.st, longLease, idem.WithRelease(func(err error) bool { return !errors.Is(err, errPermanent) }))
	id := newID(t)
	_, err := r.Do(s.ctx, id, fpA, func(context.Context) ([]byte, error) { return nil, fmt.Errorf("charge: %w", errPermanent) })
	if !errors.Is(err, errPermanent) {
		t.Fatalf("Do: %v, want fn's error", err)
	}
	var runs atomic.Int32
	_, err = r.Do(s.ctx, id, fpA, value(&runs, "never"))
	var failed *idem.FailedError
	if !errors.As(err, &failed) || !errors.Is(err, idem.ErrFailed) || failed.Message != "charge: "+errPermanent.Error() {
		t.Fatalf("repeat after a recorded failure: %v, want *FailedError with fn's message", err)
	}
	if runs.Load() != 0 {
		t.Fatal("fn ran again after a recorded failure")
	}
}

func testPanicReleases(t *testing.T, s *suite) {
	r := s.runner(t, s.st, longLease)
	id := newID(t)
	func() {
		defer func() {
			if p := recover(); p != "idemtest: boom" {
				t.Errorf("recovered %v, want fn's panic to go on", p)
			}
		}()
		_, _ = r.Do(s.ctx, id, fpA, func(context.Context) ([]byte, error) { panic("idemtest: boom") })
	}()
	var runs atomic.Int32
	mustDo(t, r, s.ctx, id, fpA, value(&runs, "after-panic"))
	if runs.Load() != 1 {
		t.Fatal("fn did not run again after a panic released the key")
	}
}

// testRenewal runs fn for several leases; renewals keep every concurrent call
// in flight, and the result is stored. The lease is twice the suite's so that
// a renewal delayed by a loaded machine (up to two thirds of it) still lands.
func testRenewal(t *testing.T, s *suite) {
	lease := 2 * Lease
	r := s.runner(t, s.st, lease)
	id := newID(t)
	var inflight int
	res, err := r.Do(s.ctx, id, fpA, func(ctx context.Context) ([]byte, error) {
		deadline := time.Now().Add(5 * lease / 2)
		for time.Now().Before(deadline) {
			time.Sleep(lease / 4) // the lease runs on the store's real clock
			_, err := r.Do(ctx, id, fpA, func(context.Context) ([]byte, error) { return nil, errors.New("ran twice") })
			if !errors.Is(err, idem.ErrInFlight) {
				return nil, fmt.Errorf("concurrent Do after %d in-flight answers: %v, want ErrInFlight", inflight, err)
			}
			inflight++
		}
		return []byte("long"), nil
	})
	if err != nil || string(res.Value) != "long" {
		t.Fatalf("Do = %q, %v", res.Value, err)
	}
	expectReplay(t, r, s.ctx, id, "long")
}

func testTakeover(t *testing.T, s *suite) {
	id := newID(t)
	// A holder that died: claimed, never renewed, never completed.
	dead, err := s.st.Claim(s.ctx, store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: Lease, Retention: Retention})
	if err != nil || dead.Outcome != store.Claimed {
		t.Fatalf("Claim: %+v, %v", dead, err)
	}
	r := s.runner(t, s.st, longLease)
	time.Sleep(Lease + slack) // the store's clock is real
	var runs atomic.Int32
	res := mustDo(t, r, s.ctx, id, fpA, value(&runs, "taken-over"))
	if !res.Takeover || res.Replayed || runs.Load() != 1 {
		t.Fatalf("Do after the holder died = %+v, runs %d; want a takeover that runs fn", res, runs.Load())
	}
	expectReplay(t, r, s.ctx, id, "taken-over")
}

// pausedRenew is a store whose Renew does nothing (answers ok) until resumed:
// a holder that stalls long enough for its lease to expire.
type pausedRenew struct {
	store.Store
	resumed atomic.Bool
}

func (p *pausedRenew) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	if !p.resumed.Load() {
		return nil
	}
	return p.Store.Renew(ctx, id, tok, lease)
}

// takeOver waits past the stalled holder's lease and completes the key with v
// through another runner.
func takeOver(t *testing.T, s *suite, id store.ID, v string) {
	t.Helper()
	time.Sleep(Lease + slack)
	other := s.runner(t, s.st, longLease)
	res, err := other.Do(s.ctx, id, fpA, func(context.Context) ([]byte, error) { return []byte(v), nil })
	if err != nil || !res.Takeover {
		t.Errorf("takeover Do = %+v, %v; want a takeover", res, err)
	}
}

func testStaleHolder(t *testing.T, s *suite) {
	stalled := &pausedRenew{Store: s.st}
	r := s.runner(t, stalled, Lease)
	id := newID(t)
	res, err := r.Do(s.ctx, id, fpA, func(context.Context) ([]byte, error) {
		takeOver(t, s, id, "new-holder")
		return []byte("stale"), nil
	})
	if !errors.Is(err, store.ErrLeaseLost) || string(res.Value) != "stale" {
		t.Fatalf("stale holder's Do = %q, %v; want its value and ErrLeaseLost", res.Value, err)
	}
	expectReplay(t, r, s.ctx, id, "new-holder")
}

func testLeaseLostCancels(t *testing.T, s *suite) {
	stalled := &pausedRenew{Store: s.st}
	r := s.runner(t, stalled, Lease)
	id := newID(t)
	_, err := r.Do(s.ctx, id, fpA, func(ctx context.Context) ([]byte, error) {
		takeOver(t, s, id, "new-holder")
		stalled.resumed.Store(true) // the next renewal finds the key taken over
		select {
		case <-ctx.Done():
		case <-time.After(longLease):
			return nil, errors.New("fn's context was not cancelled after the lease was lost")
		}
		if !errors.Is(context.Cause(ctx), store.ErrLeaseLost) {
			return nil, fmt.Errorf("cause %v, want ErrLeaseLost", context.Cause(ctx))
		}
		return nil, ctx.Err()
	})
	if !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Do: %v, want ErrLeaseLost", err)
	}
	expectReplay(t, r, s.ctx, id, "new-holder") // the stale holder neither released nor completed
}

func testConcurrent(t *testing.T, s *suite) {
	r := s.runner(t, s.st, longLease)
	id := newID(t)
	const n = 16
	gate := make(chan struct{})
	var runs, inflight, others atomic.Int32
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			_, err := r.Do(s.ctx, id, fpA, func(context.Context) ([]byte, error) {
				runs.Add(1)
				<-gate // held until every other call has answered
				return []byte("once"), nil
			})
			switch {
			case errors.Is(err, idem.ErrInFlight):
				inflight.Add(1)
			case err != nil:
				t.Errorf("Do: %v", err)
			}
			if others.Add(1) == n-1 {
				close(gate)
			}
		})
	}
	wg.Wait()
	if runs.Load() != 1 || inflight.Load() != n-1 {
		t.Fatalf("fn ran %d times, %d in flight; want 1 and %d", runs.Load(), inflight.Load(), n-1)
	}
	expectReplay(t, r, s.ctx, id, "once")
}

func testScopes(t *testing.T, s *suite) {
	r := s.runner(t, s.st, longLease)
	id := newID(t)
	other := store.ID{Scope: id.Scope + "-other", Key: id.Key}
	var runs atomic.Int32
	mustDo(t, r, s.ctx, id, fpA, value(&runs, "one"))
	mustDo(t, r, s.ctx, other, fpB, value(&runs, "two"))
	expectReplay(t, r, s.ctx, id, "one")
	if runs.Load() != 2 {
		t.Fatalf("fn ran %d times over two scopes, want 2", runs.Load())
	}
}

func testInvalid(t *testing.T, s *suite) {
	r := s.runner(t, s.st, longLease)
	_, err := r.Do(s.ctx, store.ID{Scope: "idemtest"}, fpA, func(context.Context) ([]byte, error) {
		t.Error("fn ran for an empty key")
		return nil, nil
	})
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("Do with an empty key: %v, want store.ErrInvalid", err)
	}
}
