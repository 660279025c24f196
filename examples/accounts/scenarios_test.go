package accounts

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/internal/testclock"
)

// barrier releases its waiters once n have arrived (or fails the test after 5 s).
type barrier struct {
	mu      sync.Mutex
	n       int
	release chan struct{}
}

func newBarrier(n int) *barrier { return &barrier{n: n, release: make(chan struct{})} }

func (b *barrier) wait(t *testing.T) {
	b.mu.Lock()
	b.n--
	if b.n == 0 {
		close(b.release)
	}
	b.mu.Unlock()
	select {
	case <-b.release:
	case <-time.After(5 * time.Second):
		t.Error("barrier: the other replica never reached its write")
	}
}

// TestReferenceScenarios runs scenarios 1-8 of docs/account-service.md section 5.2 in order against
// one account, with two replicas (two services, each with its own projection; for
// Postgres over shared tables) sharing one simulated log, or the real server at
// CELERIANT_ADDR. Assertions read the log itself. The clock advances 5 s between
// scenarios (40 s in all, inside the 90 s window), so index lifetimes measured against
// the wrong clock would show; on the simulator it is also the server's clock.
func TestReferenceScenarios(t *testing.T) {
	forEachKind(t, func(t *testing.T, mk func(*testing.T, *testclock.Clock, time.Duration) Projection) {
		e := newLogEnv(t, mk)
		referenceScenarios(t, e, e.pod(0), e.pod(0), func() {})
	})
}

// referenceScenarios runs the scenarios of TestReferenceScenarios on e with two
// replicas; between scenarios the clock advances 5 s and between runs.
func referenceScenarios(t *testing.T, e *env, podA, podB *pod, between func()) {
	ctx := context.Background()
	acct, acct2 := acctID(e.name("go-suite-acct-1")), acctID(e.name("go-suite-acct-2"))
	label := e.name("go")
	want := func(step string, got Result, err error, bal int64, ver uint64) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if got != (Result{BalanceCents: bal, AggregateVersion: ver}) {
			t.Fatalf("%s: got %+v, want {%d, v%d}", step, got, bal, ver)
		}
	}
	count := func(step string, id uuid.UUID, n int) {
		t.Helper()
		if got := len(e.events(id)); got != n {
			t.Fatalf("%s: %d events on %s, want %d", step, got, id, n)
		}
	}
	once := func(step string, id uuid.UUID, ids ...uuid.UUID) {
		t.Helper()
		for _, x := range ids {
			if n := e.countID(id, x); n != 1 {
				t.Fatalf("%s: EventId %s appears %d times, want exactly once", step, x, n)
			}
		}
	}

	// 1: a first deposit.
	r, err := podA.Deposit(ctx, acct, 100, eid(label, 1))
	want("1 deposit", r, err, 100, 1)
	count("1", acct, 1)
	e.clock.Add(5 * time.Second)
	between()

	// 2: same-replica retry after a lost response: served by the index.
	r, err = podA.Deposit(ctx, acct, 100, eid(label, 1))
	want("2 retry", r, err, 100, 1)
	count("2", acct, 1)
	e.clock.Add(5 * time.Second)
	between()

	// 3: cross-replica retry.
	r, err = podA.Deposit(ctx, acct, 50, eid(label, 2))
	want("3 pod_a", r, err, 150, 2)
	r, err = podB.Deposit(ctx, acct, 50, eid(label, 2))
	want("3 pod_b retry", r, err, 150, 2)
	count("3", acct, 2)
	e.clock.Add(5 * time.Second)
	between()

	// 4: concurrent duplicate: both replicas derive seq 3 at version 2 (the barrier
	// holds each one's first write until both caught up); one lands, the other bounces
	// and finds the first in its catch-up. No 409.
	race := func(fa, fb func() (Result, error)) (ra, rb Result, ea, eb error) {
		bar := newBarrier(2)
		podA.store.beforeWrite = func(n int) {
			if n == 1 {
				bar.wait(t)
			}
		}
		podB.store.beforeWrite = podA.store.beforeWrite
		podA.store.writes, podB.store.writes = 0, 0
		before := len(podA.sleeps.Sleeps()) + len(podB.sleeps.Sleeps())
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); ra, ea = fa() }()
		go func() { defer wg.Done(); rb, eb = fb() }()
		wg.Wait()
		podA.store.beforeWrite, podB.store.beforeWrite = nil, nil
		// Exactly one replica lost the race: one 2003, one backoff, one retry.
		if n := len(podA.sleeps.Sleeps()) + len(podB.sleeps.Sleeps()) - before; n != 1 {
			t.Errorf("race: %d backoffs, want 1 (the loser's)", n)
		}
		return
	}
	ra, rb, ea, eb := race(
		func() (Result, error) { return podA.Deposit(ctx, acct, 25, eid(label, 3)) },
		func() (Result, error) { return podB.Deposit(ctx, acct, 25, eid(label, 3)) })
	want("4 pod_a", ra, ea, 175, 3)
	want("4 pod_b", rb, eb, 175, 3)
	count("4", acct, 3)
	once("4", acct, eid(label, 3))
	e.clock.Add(5 * time.Second)
	between()

	// 5: concurrent siblings with the same derived seq: the loser re-derives.
	ra, rb, ea, eb = race(
		func() (Result, error) { return podA.Deposit(ctx, acct, 10, eid(label, 4)) },
		func() (Result, error) { return podB.Deposit(ctx, acct, 20, eid(label, 5)) })
	if ea != nil || eb != nil {
		t.Fatalf("5: errors %v / %v", ea, eb)
	}
	switch {
	case ra == (Result{185, 4}) && rb == (Result{205, 5}):
	case rb == (Result{195, 4}) && ra == (Result{205, 5}):
	default:
		t.Fatalf("5: results %+v / %+v, want versions 4 and 5 ending at 205", ra, rb)
	}
	count("5", acct, 5)
	once("5", acct, eid(label, 4), eid(label, 5))
	e.clock.Add(5 * time.Second)
	between()

	// 6: business-rule failure, nothing appended.
	_, err = podA.Withdraw(ctx, acct, 100000, eid(label, 6))
	var funds *InsufficientFundsError
	if !errors.As(err, &funds) || !errors.Is(err, ErrInsufficientFunds) || funds.BalanceCents != 205 {
		t.Fatalf("6: got %v, want InsufficientFunds with balance 205", err)
	}
	count("6", acct, 5)
	e.clock.Add(5 * time.Second)
	between()

	// 7: cross-replica transfer retry.
	tr, err := podA.Transfer(ctx, acct, acct2, 105, eid(label, 7))
	wantTr := TransferResult{From: Result{100, 6}, To: Result{105, 1}}
	if err != nil || tr != wantTr {
		t.Fatalf("7 pod_a: %+v, %v; want %+v", tr, err, wantTr)
	}
	tr, err = podB.Transfer(ctx, acct, acct2, 105, eid(label, 7))
	if err != nil || tr != wantTr {
		t.Fatalf("7 pod_b retry: %+v, %v; want %+v", tr, err, wantTr)
	}
	count("7", acct, 6)
	count("7", acct2, 1)
	once("7", acct, eid(label, 7))
	once("7", acct2, eid(label, 7))
	e.clock.Add(5 * time.Second)
	between()

	// 8: late retry after cross-replica folds (the index-lifetime regression).
	r, err = podB.Deposit(ctx, acct, 7, eid(label, 8))
	want("8 pod_b", r, err, 107, 7)
	r, err = podA.Deposit(ctx, acct, 9, eid(label, 9))
	want("8 pod_a folds pod_b", r, err, 116, 8)
	e.clock.Add(5 * time.Second)
	between()
	r, err = podA.Deposit(ctx, acct, 100, eid(label, 1))
	want("8 late retry of eid1", r, err, 100, 1)
	count("8", acct, 8)

	// The final streams, exactly as docs/account-service.md section 5.2 states them.
	evs := e.events(acct)
	wantTypes := []EventType{Deposited, Deposited, Deposited, Deposited, Deposited, TransferredOut, Deposited, Deposited}
	for i, ev := range evs {
		if EventType(ev.TypeMajor) != wantTypes[i] {
			t.Errorf("acct event %d: type %v, want %v", i+1, EventType(ev.TypeMajor), wantTypes[i])
		}
		if ev.ClientSeq != uint64(i+1) {
			t.Errorf("acct event %d: ClientSeq %d, want %d", i+1, ev.ClientSeq, i+1)
		}
	}
	for n := 1; n <= 9; n++ {
		if n == 6 {
			if c := e.countID(acct, eid(label, 6)); c != 0 {
				t.Errorf("the refused withdraw's EventId appears %d times", c)
			}
			continue
		}
		once("final", acct, eid(label, n))
	}
	if evs2 := e.events(acct2); len(evs2) != 1 || EventType(evs2[0].TypeMajor) != TransferredIn || evs2[0].ClientSeq != 1 {
		t.Errorf("acct2 stream: %+v, want one TransferredIn with ClientSeq 1", evs2)
	}
	for _, p := range []*pod{podA, podB} {
		if b, err := p.Balance(ctx, acct, 0); err != nil || b != (Result{116, 8}) {
			t.Errorf("balance of acct: %+v, %v; want {116, 8}", b, err)
		}
		if b, err := p.Balance(ctx, acct2, 0); err != nil || b != (Result{105, 1}) {
			t.Errorf("balance of acct2: %+v, %v; want {105, 1}", b, err)
		}
	}
}
