package accounts

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/internal/testclock"
)

func TestIDs(t *testing.T) {
	for name, want := range map[string]uuid.UUID{
		"DemoOrg": OrgID, "Account": AccountTypeID, "ReferenceApiService": ServiceClientID,
		"Alice": AliceID, "Bob": BobID, "Charlie": CharlieID, "idemkey/EventId": EventIDNamespace,
	} {
		if got := uuid.NewSHA1(ReferenceNamespace, []byte(name)); got != want {
			t.Errorf("v5(%q) = %s, constant says %s", name, got, want)
		}
	}
	// The reference's test accounts (docs/account-service.md section 2.1).
	if got := acctID("mem-suite-acct-1"); got != uuid.MustParse("e73840c7-d2f2-5464-9f69-2b4b0c85834f") {
		t.Errorf("mem-suite-acct-1 = %s", got)
	}
}

func TestEventIDFor(t *testing.T) {
	dep := Operation("deposit", 100, AliceID)
	if dep != "deposit 6128e305-7e13-5ce6-ba25-6a4b44cc9f0e 100" {
		t.Fatalf("Operation = %q", dep)
	}
	a := EventIDFor("tenant", "key-1", dep)
	if a != EventIDFor("tenant", "key-1", dep) {
		t.Fatal("EventIDFor is not deterministic")
	}
	if a.Version() != 5 {
		t.Errorf("version %d, want 5", a.Version())
	}
	// Pinned vector: changing the derivation would make retries after a deploy write twice.
	if want := uuid.NewSHA1(EventIDNamespace, []byte("\x06tenant\x05key-1\x30"+dep)); a != want {
		t.Errorf("EventIDFor(tenant, key-1, %q) = %s, want %s", dep, a, want)
	}
	distinct := []uuid.UUID{
		EventIDFor("ab", "c", dep), EventIDFor("a", "bc", dep), EventIDFor("", "abc", dep), EventIDFor("abc", "", dep),
		EventIDFor("tenant", "key-2", dep), EventIDFor("other", "key-1", dep), a,
		// The same key for another operation: another EventId.
		EventIDFor("tenant", "key-1", Operation("deposit", 101, AliceID)),
		EventIDFor("tenant", "key-1", Operation("withdraw", 100, AliceID)),
		EventIDFor("tenant", "key-1", Operation("deposit", 100, BobID)),
		EventIDFor("tenant", "key-1", Operation("transfer", 100, AliceID, BobID)),
		EventIDFor("tenant", "key-1", Operation("transfer", 100, BobID, AliceID)),
	}
	seen := map[uuid.UUID]bool{}
	for _, id := range distinct {
		if seen[id] {
			t.Fatalf("collision: %s", id)
		}
		seen[id] = true
	}
	// A UUID-shaped key is hashed too: two tenants' identical UUID keys never meet.
	k := "6f9619ff-8b86-d011-b42d-00cf4fc964ff"
	if EventIDFor("t1", k, dep) == EventIDFor("t2", k, dep) || EventIDFor("t1", k, dep) == uuid.MustParse(k) {
		t.Error("UUID keys must be scoped")
	}
	if NewEventID() == NewEventID() || NewEventID().Version() != 4 {
		t.Error("NewEventID must be random v4")
	}
}

func TestPayloadRoundTrip(t *testing.T) {
	other := AliceID
	for _, tc := range []struct {
		typ  EventType
		want string
		d    int64
	}{
		{Deposited, `{"AmountCents":42}`, 42},
		{Withdrawn, `{"AmountCents":42}`, -42},
		{TransferredOut, `{"AmountCents":42,"ToAccountId":"6128e305-7e13-5ce6-ba25-6a4b44cc9f0e"}`, -42},
		{TransferredIn, `{"AmountCents":42,"FromAccountId":"6128e305-7e13-5ce6-ba25-6a4b44cc9f0e"}`, 42},
	} {
		got := encodePayload(tc.typ, 42, other)
		if string(got) != tc.want {
			t.Errorf("%v: %s, want %s", tc.typ, got, tc.want)
		}
		if d := delta(uint64(tc.typ), got); d != tc.d {
			t.Errorf("%v: delta %d, want %d", tc.typ, d, tc.d)
		}
	}
	if delta(99, []byte(`{"AmountCents":5}`)) != 0 || delta(1, []byte("garbage")) != 0 {
		t.Error("unknown types and undecodable payloads fold as zero")
	}
}

// TestFoldIndexWindow checks the fold's window arithmetic: age in server time against the
// newest batch of the read, own ClientSeq only, skipping folded versions.
func TestFoldIndexWindow(t *testing.T) {
	other := uuid.New()
	e1, e2, e3 := uuid.New(), uuid.New(), uuid.New()
	batches := []celeriant.Batch{
		{Version: 1, ClientID: ServiceClientID, ServerTimestamp: 1_000, Events: []celeriant.Event{{ClientSeq: 1, EventID: e1, TypeMajor: 1, Value: encodePayload(Deposited, 10, uuid.Nil)}}},
		{Version: 2, ClientID: other, ServerTimestamp: 50_000, Events: []celeriant.Event{{ClientSeq: 9, EventID: e2, TypeMajor: 1, Value: encodePayload(Deposited, 5, uuid.Nil)}}},
		{Version: 3, ClientID: ServiceClientID, ServerTimestamp: 91_000, Events: []celeriant.Event{{ClientSeq: 2, EventID: e3, TypeMajor: 2, Value: encodePayload(Withdrawn, 3, uuid.Nil)}}},
	}
	got := map[uuid.UUID]indexEntry{}
	st := foldBatches(State{}, batches, ServiceClientID, 90*time.Second, celeriant.Milliseconds, func(e indexEntry) { got[e.eventID] = e })
	if st != (State{BalanceCents: 12, Version: 3, MaxClientSeq: 2}) {
		t.Errorf("state %+v", st)
	}
	if _, ok := got[e1]; ok {
		t.Error("an event 90 s older than the tip must not be indexed")
	}
	if g := got[e2]; g.remaining != 49*time.Second || g.res != (Result{15, 2}) {
		t.Errorf("e2: %+v", g)
	}
	if g := got[e3]; g.remaining != 90*time.Second || g.res != (Result{12, 3}) {
		t.Errorf("e3: %+v", g)
	}
	// Already folded versions are skipped.
	if again := foldBatches(st, batches, ServiceClientID, 90*time.Second, celeriant.Milliseconds, nil); again != st {
		t.Errorf("refold changed state: %+v", again)
	}
}

func TestNewRejectsMissingParts(t *testing.T) {
	sim := celeriantsim.New(celeriantsim.Options{})
	if _, err := New(nil, NewMemoryProjection()); err == nil {
		t.Error("nil store accepted")
	}
	if _, err := New(sim, nil); err == nil {
		t.Error("nil projection accepted")
	}
	if _, err := New(sim, NewMemoryProjection(), WithClientID(uuid.Nil)); err == nil {
		t.Error("nil client id accepted")
	}
}

func TestValidation(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, func(*testing.T, *testclock.Clock, time.Duration) Projection { return NewMemoryProjection() })
	p := e.pod(0)
	acct := acctID("validation")
	for _, amount := range []int32{0, -5} {
		if _, err := p.Deposit(ctx, acct, amount, uuid.Nil); !errors.Is(err, ErrValidation) {
			t.Errorf("deposit %d: %v, want ErrValidation", amount, err)
		}
		if _, err := p.Withdraw(ctx, acct, amount, uuid.Nil); !errors.Is(err, ErrValidation) {
			t.Errorf("withdraw %d: %v, want ErrValidation", amount, err)
		}
	}
	before := e.sim.Stats()
	var ve *ValidationError
	if _, err := p.Transfer(ctx, acct, acct, 5, uuid.Nil); !errors.As(err, &ve) || ve.Message != "Cannot transfer to the same account." {
		t.Errorf("same-account transfer: %v", err)
	}
	if e.sim.Stats() != before {
		t.Error("a same-account transfer must be refused before any I/O")
	}
	if _, err := p.Deposit(ctx, acct, 10, uuid.Nil); err != nil {
		t.Fatal(err)
	}
	_, err := p.Transfer(ctx, acct, acctID("validation-2"), 11, uuid.Nil)
	var funds *InsufficientFundsError
	if !errors.As(err, &funds) || funds.BalanceCents != 10 || funds.RequestedCents != 11 {
		t.Errorf("transfer above balance: %v", err)
	}
	if !strings.Contains(err.Error(), "cannot process $0.11, balance is $0.10") {
		t.Errorf("message %q", err.Error())
	}
	if len(e.events(acct)) != 1 {
		t.Error("refused requests must not write")
	}
	// A retry of a landed request is answered from the index even if the business rules
	// would now refuse it (docs/account-service.md section 3.2).
	x := eid("validation", 1)
	if r, err := p.Withdraw(ctx, acct, 10, x); err != nil || r != (Result{0, 2}) {
		t.Fatalf("withdraw all: %+v, %v", r, err)
	}
	if r, err := p.Withdraw(ctx, acct, 10, x); err != nil || r != (Result{0, 2}) {
		t.Errorf("retry of a landed withdraw: %+v, %v; want the original answer", r, err)
	}
}

// TestErrorMapping pins which event-store failures become which service errors.
func TestErrorMapping(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		inject func(*celeriantsim.Sim)
		want   error
	}{
		{"busy 11000", func(s *celeriantsim.Sim) { s.InjectWriteError(celeriant.CodeServerBusy, "{}") }, ErrUnavailable},
		{"backpressure 2012", func(s *celeriantsim.Sim) { s.InjectWriteError(celeriant.CodeWriteReplicationBackpressure, "{}") }, ErrUnavailable},
		{"not leader", func(s *celeriantsim.Sim) { s.InjectWriteError(celeriant.CodeWriteNotLeader, "{}") }, ErrUnavailable},
		{"closed", func(s *celeriantsim.Sim) { _ = s.Close() }, ErrUnavailable},
		{"serialise 2004", func(s *celeriantsim.Sim) { s.InjectWriteError(celeriant.CodeWriteSerialiseDatablocks, "{}") }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(*testing.T, *testclock.Clock, time.Duration) Projection { return NewMemoryProjection() })
			p := e.pod(0)
			tc.inject(e.sim)
			_, err := p.Deposit(ctx, acctID("mapping"), 5, uuid.Nil)
			if err == nil {
				t.Fatal("no error")
			}
			for _, class := range []error{ErrUnavailable, ErrConflict, ErrValidation, ErrInsufficientFunds} {
				if errors.Is(err, class) != (class == tc.want) {
					t.Errorf("%v: errors.Is(%v) = %v", err, class, errors.Is(err, class))
				}
			}
			if len(p.sleeps.Sleeps()) != 0 {
				t.Error("fatal errors are not retried in the loop")
			}
		})
	}
}

// TestReplicationErrorHolds: 2007 is an ambiguous outcome; the loop holds the seq, and the
// retry finds the committed write (here: it did not commit, so the retry lands it).
func TestReplicationErrorHolds(t *testing.T) {
	e := newEnv(t, func(*testing.T, *testclock.Clock, time.Duration) Projection { return NewMemoryProjection() })
	p := e.pod(0)
	e.sim.InjectWriteError(celeriant.CodeWriteReplicationError, "{}")
	acct := acctID("2007")
	if r, err := p.Deposit(context.Background(), acct, 5, uuid.Nil); err != nil || r != (Result{5, 1}) {
		t.Fatalf("got %+v, %v", r, err)
	}
	if evs := e.events(acct); len(evs) != 1 || evs[0].ClientSeq != 1 || len(p.sleeps.Sleeps()) != 1 {
		t.Errorf("log %+v, backoffs %v", evs, p.sleeps.Sleeps())
	}
}

func TestConfigurableRetries(t *testing.T) {
	e := newEnv(t, func(*testing.T, *testclock.Clock, time.Duration) Projection { return NewMemoryProjection() })
	p := e.pod(0, WithMaxRetries(5), WithBackoff(10*time.Millisecond, 0))
	for range 5 {
		e.sim.ForceConflict()
	}
	if _, err := p.Deposit(context.Background(), acctID("retries"), 5, uuid.Nil); !errors.Is(err, ErrConflict) {
		t.Fatalf("got %v", err)
	}
	want := []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond, 160 * time.Millisecond}
	got := p.sleeps.Sleeps()
	if len(got) != len(want) {
		t.Fatalf("sleeps %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("sleeps %v, want %v", got, want)
		}
	}
	if p.store.writes != 5 {
		t.Errorf("%d writes, want 5", p.store.writes)
	}
}

// TestCancelledBackoff: the default sleep honours the context.
func TestCancelledBackoff(t *testing.T) {
	e := newEnv(t, func(*testing.T, *testclock.Clock, time.Duration) Projection { return NewMemoryProjection() })
	wrote := make(chan struct{})
	store := &hookStore{EventStore: e.sim, afterWrite: func(int, error) { close(wrote) }}
	svc, err := New(store, NewMemoryProjection(), WithBackoff(time.Hour, 0))
	if err != nil {
		t.Fatal(err)
	}
	e.sim.ForceConflict()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := svc.Deposit(ctx, acctID("cancel"), 5, uuid.Nil); done <- err }()
	<-wrote // attempt 1 got its 2003; the loop is about to sleep an hour
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
}

func TestSeed(t *testing.T) {
	forEachKind(t, func(t *testing.T, mk func(*testing.T, *testclock.Clock, time.Duration) Projection) {
		e := newEnv(t, mk)
		pods := []*pod{e.pod(0), e.pod(0), e.pod(0)}
		var wg sync.WaitGroup
		for _, p := range pods {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := p.Seed(context.Background()); err != nil {
					t.Errorf("seed: %v", err)
				}
			}()
		}
		wg.Wait()
		if err := pods[0].Seed(context.Background()); err != nil {
			t.Errorf("second seed: %v", err)
		}
		for _, a := range SeededAccounts() {
			evs := e.events(a.ID)
			if len(evs) != 1 || evs[0].ClientSeq != 0 || evs[0].EventID != uuid.Nil {
				t.Errorf("%s: %+v, want one seed event with seq 0 and no EventId", a.Name, evs)
			}
			for _, p := range pods {
				if r, err := p.Balance(context.Background(), a.ID, 0); err != nil || r != (Result{a.SeedBalance, 1}) {
					t.Errorf("%s balance %+v, %v", a.Name, r, err)
				}
			}
		}
		// The first service write after a seed uses ClientSeq 1.
		if _, err := pods[1].Deposit(context.Background(), AliceID, 1, uuid.Nil); err != nil {
			t.Fatal(err)
		}
		if evs := e.events(AliceID); evs[1].ClientSeq != 1 {
			t.Errorf("first write after seed: seq %d", evs[1].ClientSeq)
		}
		if got := pods[0].Accounts(); len(got) != 3 || got[0].Name != "Alice" {
			t.Errorf("Accounts() = %+v", got)
		}
	})
}

// TestTrimmed covers the admitted gap (docs/account-service.md section 6.1.1): a cold replica's
// catch-up and a history read over a trimmed range re-read from the minimum available
// version instead of failing.
func TestTrimmed(t *testing.T) {
	forEachKind(t, func(t *testing.T, mk func(*testing.T, *testclock.Clock, time.Duration) Projection) {
		ctx := context.Background()
		e := newEnv(t, mk)
		podA := e.pod(0)
		acct := acctID("trimmed")
		for i := range 4 {
			if _, err := podA.Deposit(ctx, acct, 10, eid("trimmed", i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.sim.Trim(Key(acct), 3); err != nil {
			t.Fatal(err)
		}
		h, err := podA.History(ctx, acct, 1)
		if err != nil || len(h.Events) != 2 || h.Events[0].AggregateVersion != 3 || h.CurrentAggregateVersion != 4 || h.BalanceCents != 40 {
			t.Fatalf("history: %+v, %v", h, err)
		}
		// A cold replica (memory only: the Postgres rows are shared) folds what is left.
		if _, ok := podA.proj.(*MemoryProjection); ok {
			podB := e.pod(0)
			if r, err := podB.Balance(ctx, acct, 0); err != nil || r != (Result{20, 4}) {
				t.Errorf("cold replica: %+v, %v; want the trimmed remainder {20, 4}", r, err)
			}
			if r, err := podB.Deposit(ctx, acct, 1, uuid.Nil); err != nil || r != (Result{21, 5}) {
				t.Errorf("cold replica write: %+v, %v", r, err)
			}
		}
	})
}

func TestBalanceAndHistory(t *testing.T) {
	forEachKind(t, func(t *testing.T, mk func(*testing.T, *testclock.Clock, time.Duration) Projection) {
		ctx := context.Background()
		e := newEnv(t, mk)
		podA, podB := e.pod(0), e.pod(0)
		a, b := acctID("hist-a"), acctID("hist-b")
		if r, err := podA.Balance(ctx, a, 0); err != nil || r != (Result{}) {
			t.Fatalf("unknown account: %+v, %v", r, err)
		}
		if _, err := podA.Deposit(ctx, a, 500, uuid.Nil); err != nil {
			t.Fatal(err)
		}
		if _, err := podA.Withdraw(ctx, a, 100, uuid.Nil); err != nil {
			t.Fatal(err)
		}
		if _, err := podA.Transfer(ctx, a, b, 150, uuid.Nil); err != nil {
			t.Fatal(err)
		}
		// minVersion already reached: no read of the log.
		reads := e.sim.Stats().Reads
		if r, err := podA.Balance(ctx, a, 3); err != nil || r != (Result{250, 3}) {
			t.Errorf("balance: %+v, %v", r, err)
		}
		if e.sim.Stats().Reads != reads {
			t.Error("Balance with a satisfied minVersion must not read Celeriant")
		}
		h, err := podB.History(ctx, a, 0)
		if err != nil {
			t.Fatal(err)
		}
		if h.BalanceCents != 250 || h.CurrentAggregateVersion != 3 || len(h.Events) != 3 {
			t.Fatalf("history %+v", h)
		}
		if ev := h.Events[2]; ev.Type != TransferredOut || ev.AmountCents != 150 || ev.ToAccountID == nil || *ev.ToAccountID != b || ev.Timestamp == 0 {
			t.Errorf("transfer event %+v", ev)
		}
		hb, err := podB.History(ctx, b, 1)
		if err != nil || len(hb.Events) != 1 || hb.Events[0].FromAccountID == nil || *hb.Events[0].FromAccountID != a {
			t.Errorf("history of b: %+v, %v", hb, err)
		}
		h2, err := podB.History(ctx, a, 2)
		if err != nil || len(h2.Events) != 2 || h2.Events[0].Type != Withdrawn {
			t.Errorf("history from 2: %+v, %v", h2, err)
		}
	})
}
