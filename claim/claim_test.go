package claim_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// slowStore answers each claim after delay and records when renewals arrive.
type slowStore struct {
	store.Store
	delay time.Duration
	mu    sync.Mutex
	renew []time.Time
	hang  bool // Claim waits for its context instead
}

func (s *slowStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if s.hang {
		<-ctx.Done()
		return store.ClaimResult{}, ctx.Err()
	}
	time.Sleep(s.delay)
	return s.Store.Claim(ctx, req)
}

func (s *slowStore) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	s.mu.Lock()
	s.renew = append(s.renew, time.Now())
	s.mu.Unlock()
	return s.Store.Renew(ctx, id, tok, lease)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// notInProcess hides the memory store's InProcess, so calls run under deadlines.
type notInProcess struct{ store.Store }

func newClaimer(t *testing.T, st store.Store, lease time.Duration) *claim.Claimer {
	t.Helper()
	cl, err := claim.New(claim.Config{Store: st, Lease: lease, Retention: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// The first renewal is due a third of the lease after the claim was sent, not
// after its answer arrived: the store counts the lease from before the answer.
func TestRenewalDatedFromSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &slowStore{Store: memory.New(), delay: 2 * time.Second}
		cl := newClaimer(t, st, 9*time.Second)
		t0 := time.Now()
		res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: store.ID{Key: "k"}})
		if err != nil || res.Outcome != store.Claimed || !sent.Equal(t0) {
			t.Fatalf("Claim = %+v, sent %v after t0, %v", res, sent.Sub(t0), err)
		}
		var e claim.Execution
		e.Start(cl, t.Context(), store.ID{Key: "k"}, res.Token, sent, nil)
		time.Sleep(3 * time.Second) // to t0+5s, between the first renewal and the second
		e.Stop()
		st.mu.Lock()
		defer st.mu.Unlock()
		if len(st.renew) != 1 || st.renew[0].Sub(t0) != 3*time.Second {
			t.Fatalf("renewals at %v after the send, want one at 3s", st.renew)
		}
	})
}

// A renewal that finds the lease taken over reports store.ErrLeaseLost to the
// execution's cancel function, and renewals stop.
func TestLeaseLostCancels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		cl := newClaimer(t, mem, 3*time.Second)
		id := store.ID{Key: "k"}
		res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		// Another holder takes the key over (the token no longer owns it).
		if err := mem.Release(t.Context(), id, res.Token); err != nil {
			t.Fatal(err)
		}
		if _, _, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancelCause(t.Context())
		var e claim.Execution
		e.Start(cl, ctx, id, res.Token, sent, cancel)
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		if !errors.Is(context.Cause(ctx), store.ErrLeaseLost) || !e.LeaseLost() {
			t.Fatalf("cause %v, lost %v; want store.ErrLeaseLost", context.Cause(ctx), e.LeaseLost())
		}
		e.Stop()
	})
}

// The claim itself runs under the claim deadline.
func TestClaimBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &slowStore{Store: notInProcess{memory.New()}, hang: true}
		cl, err := claim.New(claim.Config{Store: st, Lease: time.Second, Retention: time.Hour,
			Timeouts: claim.Timeouts{Claim: 2 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		_, _, err = cl.Claim(t.Context(), store.ClaimRequest{ID: store.ID{Key: "k"}})
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) != 2*time.Second {
			t.Fatalf("Claim: %v after %v; want a deadline after 2s", err, time.Since(t0))
		}
	})
}

// failing fails the first n completions.
type failing struct {
	store.Store
	mu sync.Mutex
	n  int
}

func (f *failing) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	f.mu.Lock()
	fail := f.n > 0
	f.n--
	f.mu.Unlock()
	if fail {
		return errors.New("store down (injected)")
	}
	return f.Store.Complete(ctx, id, tok, resp, ret)
}

// A failing completion returns at once after its one attempt, and is retried
// in the background with back-off while the lease is held (duplicates are in
// flight meanwhile), until it succeeds or one lease has passed; then the key
// stays claimed until the lease, renewed until then, runs out.
func TestCompleteRetriesWhileLeaseHeld(t *testing.T) {
	for _, tc := range []struct {
		fails int
		ok    bool
	}{{5, true}, {1000, false}} {
		synctest.Test(t, func(t *testing.T) {
			st := &failing{Store: memory.New(), n: tc.fails}
			cl := newClaimer(t, st, time.Second)
			var e claim.Execution
			id := store.ID{Key: "k"}
			startClaimed(t, cl, &e, id)
			e.Stop()
			t0 := time.Now()
			pending, err := e.Complete(store.Response{Status: 200})
			if !pending || err == nil || time.Since(t0) != 0 {
				t.Fatalf("Complete: pending %v, %v after %v; want pending at once with the attempt's error", pending, err, time.Since(t0))
			}
			claimed := func() store.Outcome {
				res, _, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
				if err != nil {
					t.Fatal(err)
				}
				return res.Outcome
			}
			if o := claimed(); o != store.InFlight {
				t.Fatalf("duplicate while the completion is retried: %v, want in flight", o)
			}
			time.Sleep(time.Second)
			synctest.Wait()
			st.mu.Lock()
			calls := tc.fails - st.n
			st.mu.Unlock()
			switch o := claimed(); {
			case tc.ok && (o != store.Completed || calls != tc.fails+1):
				t.Fatalf("after the retries: %v after %d Complete calls; want completed after %d", o, calls, tc.fails+1)
			case !tc.ok && (o != store.InFlight || calls < 5):
				t.Fatalf("after a lease of failures: %v after %d Complete calls; want still claimed (in flight) after retries", o, calls)
			}
			if !tc.ok {
				time.Sleep(2 * time.Second) // the renewals stopped: the lease runs out
				if o := claimed(); o != store.Claimed {
					t.Fatalf("after the lease: %v, want claimed again", o)
				}
			}
		})
	}
}

// MarkCompleted is refused without a claim, and once the execution returned.
func TestMarkCompleted(t *testing.T) {
	if err := claim.MarkCompleted(context.Background(), store.Response{}); !errors.Is(err, claim.ErrNoClaim) {
		t.Fatalf("no claim: %v", err)
	}
	cl := newClaimer(t, memory.New(), time.Second)
	id := store.ID{Key: "k"}
	res, sent, _ := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
	var e claim.Execution
	e.Start(cl, t.Context(), id, res.Token, sent, nil)
	ctx := claim.NewContext(t.Context(), claim.Claim{ID: id, Token: res.Token}, &e)
	if c, ok := claim.FromContext(ctx); !ok || c.Token != res.Token {
		t.Fatalf("FromContext = %+v, %v", c, ok)
	}
	if err := claim.MarkCompleted(ctx, store.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	e.Stop()
	if inTx, resp := e.Returned(); !inTx || resp.Status != 201 {
		t.Fatalf("Returned = %v, %+v", inTx, resp)
	}
	if err := claim.MarkCompleted(ctx, store.Response{}); !errors.Is(err, claim.ErrNoClaim) {
		t.Fatalf("after return: %v", err)
	}
	if err := e.Release(); err != nil {
		t.Fatalf("Release after MarkCompleted: %v (must do nothing)", err)
	}
}

// hangRenew forwards to Store, but for the renewals numbered in hang (from 1),
// which wait for their deadline without reaching the store.
type hangRenew struct {
	store.Store
	hang map[int]bool
	mu   sync.Mutex
	sent []time.Duration // when each renewal was sent, after t0
	t0   time.Time
}

func (h *hangRenew) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	h.mu.Lock()
	h.sent = append(h.sent, time.Since(h.t0))
	n := len(h.sent)
	h.mu.Unlock()
	if h.hang[n] {
		<-ctx.Done()
		return ctx.Err()
	}
	return h.Store.Renew(ctx, id, tok, lease)
}

// A renewal that runs out of time is retried a third of the lease after it was
// sent, not after its deadline passed: the lease is counted from the last
// renewal that reached the store, and one hung renewal must not let it lapse
// while the execution still runs (a duplicate would take the key over and run
// the side effect a second time). Successful renewals are dated from their send
// too.
func TestRenewalAfterHungRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		st := &hangRenew{Store: notInProcess{mem}, hang: map[int]bool{2: true}, t0: time.Now()}
		// Renewals every 3 s, each bounded by 4 s.
		cl, err := claim.New(claim.Config{Store: st, Lease: 9 * time.Second, Retention: time.Hour, Logger: quiet,
			Timeouts: claim.Timeouts{Renew: 4 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		id := store.ID{Key: "k"}
		var e claim.Execution
		startClaimed(t, cl, &e, id)
		// The first renewal (sent at 3 s) holds the lease until 12 s; the second hangs
		// from 6 s to 10 s.
		time.Sleep(12*time.Second + 500*time.Millisecond)
		synctest.Wait()
		dup, err := mem.Claim(t.Context(), store.ClaimRequest{ID: id, Lease: 9 * time.Second, Retention: time.Hour})
		e.Stop()
		st.mu.Lock()
		defer st.mu.Unlock()
		if err != nil || dup.Outcome != store.InFlight || e.LeaseLost() {
			t.Fatalf("duplicate at 12.5 s: %v, %v (lease lost %v); renewals sent at %v; want in flight", dup.Outcome, err, e.LeaseLost(), st.sent)
		}
		if want := []time.Duration{3 * time.Second, 6 * time.Second, 10 * time.Second}; !equalDurations(st.sent, want) {
			t.Fatalf("renewals sent at %v, want %v", st.sent, want)
		}
	})
}

// notifier records the retention NotifyCompleted is given.
type notifier struct {
	store.Store
	retention time.Duration
}

func (n *notifier) NotifyCompleted(_ context.Context, _ store.ID, _ store.Token, _ store.Response, retention time.Duration) {
	n.retention = retention
}

// A store keeping a copy of records (store/tiered) is told of a record completed
// in the caller's transaction with the retention left counted from the claim's
// send, not a full one from after the execution returned: the copy must not
// outlive the record, whose retention began inside the transaction.
func TestNotifyCompletedRetentionFromStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &notifier{Store: memory.New()}
		cl := newClaimer(t, st, 10*time.Second)
		id := store.ID{Key: "k"}
		res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		var e claim.Execution
		e.Start(cl, t.Context(), id, res.Token, sent, nil)
		time.Sleep(3 * time.Second) // the handler and its transaction
		if err := claim.MarkCompleted(claim.NewContext(t.Context(), claim.Claim{ID: id, Token: res.Token}, &e), store.Response{Status: 201}); err != nil {
			t.Fatal(err)
		}
		e.Stop()
		e.Returned()
		e.NotifyCompleted(store.Response{Status: 201})
		if want := cl.Retention() - 3*time.Second; st.retention != want {
			t.Fatalf("cache told to keep the copy %v, want %v (the retention left since the claim)", st.retention, want)
		}
	})
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// startClaimed claims id and starts e under the claim.
func startClaimed(t *testing.T, cl *claim.Claimer, e *claim.Execution, id store.ID) {
	t.Helper()
	res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	e.Start(cl, t.Context(), id, res.Token, sent, nil)
}

// A Context over a parent that is never cancelled cancels itself on a lost
// lease: Done (asked before and after), Err, context.Cause and a child context
// all see it, with no cancel function from the caller.
func TestContextCancelsItselfOnLeaseLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		cl := newClaimer(t, mem, 3*time.Second)
		id := store.ID{Key: "k"}
		res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		var e claim.Execution
		var c claim.Context
		c.Set(context.WithoutCancel(t.Context()), claim.Claim{ID: id, Token: res.Token}, &e)
		e.Start(cl, &c, id, res.Token, sent, nil)
		done := c.Done()
		child, stop := context.WithCancel(&c)
		defer stop()
		if c.Err() != nil || child.Err() != nil {
			t.Fatalf("before the loss: %v, %v", c.Err(), child.Err())
		}
		if err := mem.Release(t.Context(), id, res.Token); err != nil { // the key is taken from the holder
			t.Fatal(err)
		}
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		<-done
		<-c.Done()
		<-child.Done()
		if !errors.Is(c.Err(), context.Canceled) || !errors.Is(context.Cause(&c), store.ErrLeaseLost) || !errors.Is(context.Cause(child), store.ErrLeaseLost) {
			t.Fatalf("err %v, cause %v, child's cause %v; want canceled with cause store.ErrLeaseLost", c.Err(), context.Cause(&c), context.Cause(child))
		}
		if got, ok := claim.FromContext(child); !ok || got.Token != res.Token {
			t.Fatalf("FromContext after the loss: %+v, %v", got, ok)
		}
		e.Stop()
	})
}

// A detached Context (SetDetached) keeps its parent's values but none of its
// cancellation, deadline or cause, and still cancels itself on a lost lease
// with cause store.ErrLeaseLost, even over a parent cancelled already.
func TestDetachedContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		cl := newClaimer(t, mem, 3*time.Second)
		id := store.ID{Key: "k"}
		res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		type key struct{}
		parent, cancelDeadline := context.WithDeadline(context.WithValue(t.Context(), key{}, "v"), time.Now().Add(time.Minute))
		defer cancelDeadline()
		parent, cancel := context.WithCancelCause(parent)
		cancel(errors.New("client gone"))
		var e claim.Execution
		var c claim.Context
		c.SetDetached(parent, claim.Claim{ID: id, Token: res.Token}, &e)
		e.Start(cl, &c, id, res.Token, sent, nil)
		child, stop := context.WithCancel(&c)
		defer stop()
		if _, ok := c.Deadline(); ok || c.Err() != nil || context.Cause(&c) != nil || child.Err() != nil || c.Value(key{}) != "v" {
			_, ok := c.Deadline()
			t.Fatalf("before the loss: deadline %v, err %v, cause %v, child's err %v, value %v", ok, c.Err(), context.Cause(&c), child.Err(), c.Value(key{}))
		}
		if err := mem.Release(t.Context(), id, res.Token); err != nil { // the key is taken from the holder
			t.Fatal(err)
		}
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		<-c.Done()
		<-child.Done()
		if !errors.Is(c.Err(), context.Canceled) || !errors.Is(context.Cause(&c), store.ErrLeaseLost) ||
			!errors.Is(context.Cause(child), store.ErrLeaseLost) || c.Value(key{}) != "v" {
			t.Fatalf("err %v, cause %v, child's cause %v, value %v; want canceled with cause store.ErrLeaseLost",
				c.Err(), context.Cause(&c), context.Cause(child), c.Value(key{}))
		}
		if _, ok := claim.FromContext(child); !ok {
			t.Fatal("FromContext after the loss: no claim")
		}
		e.Stop()
	})
}
