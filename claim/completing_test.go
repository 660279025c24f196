package claim_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// slowComplete is a store whose Complete lands after delay, or lands at once and
// answers only once a renewal has reached the store after it (answered).
type slowComplete struct {
	notInProcess
	delay    time.Duration
	answered chan struct{} // closed by the first renewal after the record
	mu       sync.Mutex
	done     bool
}

func (s *slowComplete) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	if s.answered == nil {
		time.Sleep(s.delay)
		return s.Store.Complete(ctx, id, tok, resp, ret)
	}
	err := s.Store.Complete(ctx, id, tok, resp, ret)
	s.mu.Lock()
	s.done = true
	s.mu.Unlock()
	<-s.answered
	return err
}

func (s *slowComplete) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	err := s.Store.Renew(ctx, id, tok, lease)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		close(s.answered)
		s.done = false
	}
	return err
}

// runOnce claims id on cl and runs an execution that answers 201.
func runOnce(t *testing.T, cl *claim.Claimer, id store.ID) (*claim.Execution, claim.Ending) {
	t.Helper()
	res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	e := &claim.Execution{}
	end := e.Run(cl, t.Context(), claim.Claimed{Claim: claim.Claim{ID: id, Token: res.Token}, Sent: sent}, nil,
		func() claim.Outcome { return claim.Outcome{Response: store.Response{Status: 201}} })
	return e, end
}

func outcome(t *testing.T, cl *claim.Claimer, id store.ID) store.Outcome {
	t.Helper()
	res, _, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return res.Outcome
}

// A completion slower than the rest of the lease (past the answer grace: the
// caller has answered) keeps the lease renewed until it ends: a duplicate in the
// meantime is in flight, never a takeover that runs the execution twice; once
// the record lands, renewals end and the key replays.
func TestLeaseRenewedWhileCompleting(t *testing.T) {
	for _, delay := range []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, 4 * time.Second} {
		t.Run(delay.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := &slowComplete{notInProcess: notInProcess{memory.New()}, delay: delay}
				cl := newClaimer(t, st, 300*time.Millisecond)
				id := store.ID{Key: "k"}
				ended := make(chan claim.Ending, 1)
				go func() { _, end := runOnce(t, cl, id); ended <- end }()
				for at := 100 * time.Millisecond; at < delay; at += 100 * time.Millisecond {
					time.Sleep(100 * time.Millisecond)
					if o := outcome(t, cl, id); o != store.InFlight {
						t.Errorf("duplicate %v into a %v completion: %v, want in flight", at, delay, o)
						break
					}
				}
				end := <-ended
				if err := cl.Wait(t.Context()); err != nil || end.Err != nil || end.LeaseLost {
					t.Fatalf("ending %+v, wait %v", end, err)
				}
				time.Sleep(time.Second) // renewals, had they gone on, would be refused now
				if o := outcome(t, cl, id); o != store.Completed {
					t.Fatalf("after the completion: %v, want completed", o)
				}
			})
		})
	}
}

// A renewal that reaches the store after the record (its answer still on the
// way) is refused and changes nothing: the completion succeeds, the execution
// reports no lost lease, the key replays.
func TestRenewalAfterRecordChangesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &slowComplete{notInProcess: notInProcess{memory.New()}, answered: make(chan struct{})}
		cl := newClaimer(t, st, 300*time.Millisecond)
		id := store.ID{Key: "k"}
		e, end := runOnce(t, cl, id)
		if end.Err != nil || end.LeaseLost || e.LeaseLost() {
			t.Fatalf("ending %+v, lease lost %v; want the completion's success", end, e.LeaseLost())
		}
		if err := cl.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		if o := outcome(t, cl, id); o != store.Completed {
			t.Fatalf("after the completion: %v, want completed", o)
		}
	})
}

// lostReply is a store whose first Complete lands but whose reply is lost.
type lostReply struct {
	notInProcess
	mu   sync.Mutex
	lost bool
}

func (s *lostReply) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	err := s.Store.Complete(ctx, id, tok, resp, ret)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.lost {
		s.lost = true
		return errors.New("connection reset after the statement was sent (injected)")
	}
	return err
}

// A completion whose reply was lost but which landed is retried, and the retry
// (the same token and response) is answered as done: logged as completed, not
// as a lost lease.
func TestLostCompletionReplyIsSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &msgLog{}
		cl, err := claim.New(claim.Config{Store: &lostReply{notInProcess: notInProcess{memory.New()}}, Lease: time.Second,
			Retention: time.Hour, Logger: slog.New(logs)})
		if err != nil {
			t.Fatal(err)
		}
		id := store.ID{Key: "k"}
		_, end := runOnce(t, cl, id)
		if err := cl.Wait(t.Context()); err != nil || !end.Pending {
			t.Fatalf("ending %+v, wait %v; want the completion pending after the lost reply", end, err)
		}
		logs.mu.Lock()
		defer logs.mu.Unlock()
		var completed bool
		for _, m := range logs.msgs {
			if strings.Contains(m, "lost") && !strings.Contains(m, "retrying") {
				t.Errorf("logged %q", m)
			}
			completed = completed || strings.Contains(m, "completed in the background")
		}
		if !completed {
			t.Errorf("logs %q; want the completion logged as done", logs.msgs)
		}
	})
}

// fakeTx is a claim.Tx that records how it ended.
type fakeTx struct {
	committed *store.Response
	rolled    bool
}

func (f *fakeTx) Commit(_ context.Context, resp store.Response, _ time.Duration) (claim.TxEnd, error) {
	f.committed = &resp
	return claim.TxCommitted, nil
}

func (f *fakeTx) Rollback(context.Context) error { f.rolled = true; return nil }

// MarkCompleted in the one-transaction mode is refused (ErrOneTx) and marks
// nothing: the execution still commits its transaction with the outcome's
// response (it used to be accepted, and the transaction was left open, neither
// committed nor rolled back).
func TestMarkCompletedRefusedInOneTx(t *testing.T) {
	cl := newClaimer(t, memory.New(), time.Second)
	id := store.ID{Key: "k"}
	tx := &fakeTx{}
	c := claim.Claim{ID: id, Token: store.NewToken()}
	var e claim.Execution
	var markErr error
	end := e.Run(cl, t.Context(), claim.Claimed{Claim: c, Sent: time.Now(), Tx: tx}, nil, func() claim.Outcome {
		markErr = claim.MarkCompleted(claim.NewContext(t.Context(), c, &e), store.Response{Status: 201})
		return claim.Outcome{Response: store.Response{Status: 202}}
	})
	if !errors.Is(markErr, claim.ErrOneTx) {
		t.Fatalf("MarkCompleted in the one-transaction mode: %v, want ErrOneTx", markErr)
	}
	if end.InTx || end.Err != nil || tx.committed == nil || tx.committed.Status != 202 || tx.rolled {
		t.Fatalf("ending %+v, committed %+v, rolled back %v; want the outcome committed", end, tx.committed, tx.rolled)
	}
}
