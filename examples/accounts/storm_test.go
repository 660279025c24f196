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

// TestStorm races many requests over two replicas on one account: the same request sent
// 16 times lands exactly once and every copy gets the same answer; 16 distinct requests
// each land at most once, every success is in the log exactly once, every refusal is a
// 409 with nothing written, and the balance is the sum of the successes. On the
// simulator, or the real server at CELERIANT_ADDR.
func TestStorm(t *testing.T) {
	forEachKind(t, func(t *testing.T, mk func(*testing.T, *testclock.Clock, time.Duration) Projection) {
		ctx := context.Background()
		e := newLogEnv(t, mk)
		pods := []*pod{e.pod(0), e.pod(0)}
		acct := acctID(e.name("storm-" + t.Name()))

		const n = 16
		x := eid("storm", 0)
		results := make([]Result, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = pods[i%2].Deposit(ctx, acct, 10, x)
			}()
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil || results[i] != (Result{10, 1}) {
				t.Errorf("duplicate %d: %+v, %v; want {10, 1}", i, results[i], errs[i])
			}
		}
		if c := e.countID(acct, x); c != 1 {
			t.Fatalf("the duplicated request landed %d times", c)
		}

		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = pods[i%2].Deposit(ctx, acct, int32(i+1), eid("storm", i+1))
			}()
		}
		wg.Wait()
		want := int64(10)
		for i := range n {
			id := eid("storm", i+1)
			switch c := e.countID(acct, id); {
			case errs[i] == nil && c == 1:
				want += int64(i + 1)
			case errors.Is(errs[i], ErrConflict) && c == 0:
			default:
				t.Errorf("request %d: err %v, in the log %d times", i+1, errs[i], c)
			}
		}
		for _, p := range pods {
			if r, err := p.Balance(ctx, acct, 0); err != nil || r.BalanceCents != want || r.AggregateVersion != uint64(len(e.events(acct))) {
				t.Errorf("balance %+v, %v; want %d at v%d", r, err, want, len(e.events(acct)))
			}
		}
		t.Logf("%d of %d distinct requests landed", len(e.events(acct))-1, n)
	})
}

// TestPostgresMigrate: Migrate is idempotent and safe to run concurrently; the lookup sees
// an index row before the account's projection row exists.
func TestPostgresMigrate(t *testing.T) {
	pool := pgPool(t)
	ctx := context.Background()
	p, err := NewPostgresProjection(pool, WithTablePrefix(randomPrefix()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b, r, m := p.Tables()
		_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+b+", "+r+", "+m)
	})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Migrate(ctx); err != nil {
				t.Errorf("Migrate: %v", err)
			}
		}()
	}
	wg.Wait()
	_, _, m := p.Tables()
	var versions int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+m).Scan(&versions); err != nil || versions != 1 {
		t.Errorf("ledger has %d versions (%v), want 1", versions, err)
	}
	acct, x := uuid.New(), uuid.New()
	_, r, _ := p.Tables()
	if _, err := pool.Exec(ctx, "INSERT INTO "+r+" VALUES ($1, $2, 42, 7, now() + interval '1 minute')", pgUUID(x), pgUUID(acct)); err != nil {
		t.Fatal(err)
	}
	st, hit, ok, err := p.lookup(ctx, acct, x)
	if err != nil || !ok || hit != (Result{42, 7}) || st != (State{}) {
		t.Errorf("lookup: %+v %+v %v %v", st, hit, ok, err)
	}
	if _, _, ok, _ := p.lookup(ctx, acct, uuid.Nil); ok {
		t.Error("a nil EventId must never hit")
	}
}
