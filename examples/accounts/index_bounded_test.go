package accounts

import (
	"context"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/testclock"
)

// TestMemoryIndexBounded: a single replica's own writes keep its cursor current, so its
// catch-ups never fold; the index must still drop expired entries instead of keeping one
// per write forever, and must keep every entry inside the window.
func TestMemoryIndexBounded(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, func(t *testing.T, c *testclock.Clock, w time.Duration) Projection {
		return NewMemoryProjection(WithMemoryClock(c.Now), WithMemoryWindow(w))
	})
	p := e.pod(0)
	acct := acctID("memory-bounded")
	const n = 1000
	for i := range n {
		if _, err := p.Deposit(ctx, acct, 1, eid("memory-bounded", i)); err != nil {
			t.Fatal(err)
		}
		e.clock.Add(time.Second)
	}
	mp := p.proj.(*MemoryProjection)
	mp.mu.Lock()
	entries := len(mp.accounts[acct].recent)
	mp.mu.Unlock()
	// About 90 entries are live (one per second of the window); sweeping at twice the
	// live count keeps the map below ~2*91.
	if entries > 200 {
		t.Errorf("%d index entries after %d writes with ~90 live: expired entries are never dropped", entries, n)
	}
	// An entry 60 s old is still inside the window: its retry is answered, not rewritten.
	if r, err := p.Deposit(ctx, acct, 1, eid("memory-bounded", n-60)); err != nil || r != (Result{int64(n - 59), uint64(n - 59)}) {
		t.Errorf("retry inside the window: %+v, %v; want the original {%d, %d}", r, err, n-59, n-59)
	}
	if got := len(e.events(acct)); got != n {
		t.Errorf("log has %d events, want %d", got, n)
	}
}

// TestPostgresIndexSwept: the same for the Postgres index. A single replica never
// advances its cursor by folding, so the fold's sweep never runs; recordWrite must
// sweep expired rows now and then, or the table keeps one row per write forever.
func TestPostgresIndexSwept(t *testing.T) {
	ctx := context.Background()
	mk := newPGProjections(t)
	e := newEnv(t, func(t *testing.T, c *testclock.Clock, _ time.Duration) Projection {
		return mk(t, c, time.Millisecond) // rows expire 1 ms after their write, on the database clock
	})
	p := e.pod(0)
	acct := acctID("pg-swept")
	const n = sweepEvery + 10
	for i := range n {
		if _, err := p.Deposit(ctx, acct, 1, eid("pg-swept", i)); err != nil {
			t.Fatal(err)
		}
	}
	pg := p.proj.(*PostgresProjection)
	_, resp, _ := pg.Tables()
	var rows int
	if err := pg.pool.QueryRow(ctx, "SELECT count(*) FROM "+resp).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	// The sweep after write sweepEvery removed every row older than 1 ms; at most the
	// few rows written within that millisecond and the 10 written after it remain.
	if rows >= sweepEvery {
		t.Errorf("%d index rows after %d writes with a 1 ms window: expired rows are never swept", rows, n)
	}
	if b, err := p.Balance(ctx, acct, 0); err != nil || b != (Result{n, n}) {
		t.Errorf("balance %+v, %v; want {%d, %d}", b, err, n, n)
	}
}
