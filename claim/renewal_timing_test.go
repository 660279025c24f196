package claim

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// renewLog is a store that records when each token's renewals arrive.
type renewLog struct {
	store.Store
	mu sync.Mutex
	at map[store.Token][]time.Time
}

func (r *renewLog) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	r.mu.Lock()
	r.at[tok] = append(r.at[tok], time.Now())
	r.mu.Unlock()
	return r.Store.Renew(ctx, id, tok, lease)
}

// renewals returns when tok's renewals arrived, as offsets from t0.
func (r *renewLog) renewals(tok store.Token, t0 time.Time) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var d []time.Duration
	for _, at := range r.at[tok] {
		d = append(d, at.Sub(t0))
	}
	return d
}

// start claims key and starts e on it; it returns the claim's token and send time.
func start(t *testing.T, cl *Claimer, e *Execution, key string) (store.Token, time.Time) {
	t.Helper()
	res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: store.ID{Key: key}})
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("claim %q: %+v, %v", key, res, err)
	}
	e.Start(cl, t.Context(), store.ID{Key: key}, res.Token, sent, nil)
	return res.Token, sent
}

// minLeaseClaimer returns a Claimer at the shortest lease over a renewLog.
func minLeaseClaimer(t *testing.T) (*Claimer, *renewLog) {
	t.Helper()
	st := &renewLog{Store: memory.New(), at: map[store.Token][]time.Time{}}
	cl, err := New(Config{Store: st, Lease: MinLease, Retention: time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return cl, st
}

// renewRun is one execution: its claim's token, when the claim was sent and
// when the execution stopped (or was released).
type renewRun struct {
	tok           store.Token
	sent, stopped time.Time
}

// checkRenewedInTime fails t unless each run was renewed a third of the lease
// (MinLease) after its send at the latest, then within a third of each
// renewal, up to its stop, and never after it; it returns the renewals counted.
func checkRenewedInTime(t *testing.T, st *renewLog, runs <-chan renewRun) (renewed int) {
	t.Helper()
	third := MinLease / 3
	for r := range runs {
		got := st.renewals(r.tok, r.sent)
		renewed += len(got)
		prev := time.Duration(0)
		for _, at := range got {
			if at-prev > third || at < 0 || r.sent.Add(at).After(r.stopped) {
				t.Fatalf("claim run %v: renewals at %v after its send", r.stopped.Sub(r.sent), got)
			}
			prev = at
		}
		if r.stopped.Sub(r.sent)-prev > third {
			t.Fatalf("claim run %v: renewals at %v after its send (a gap over a third)", r.stopped.Sub(r.sent), got)
		}
	}
	return renewed
}

// Executions started one a millisecond over several leases (with pauses that
// leave none running), at the shortest lease,
// running for up to three leases: each is renewed a third of the lease after
// its claim's send at the latest, then every third of the lease, and never
// after it stopped.
func TestEveryPhaseRenewedInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl, st := minLeaseClaimer(t)
		runs := make(chan renewRun, 1000)
		var wg sync.WaitGroup
		for i := range 400 {
			if i%100 == 99 {
				time.Sleep(3 * MinLease) // none runs meanwhile
				synctest.Wait()
			}
			time.Sleep(time.Millisecond)
			wg.Go(func() {
				var e Execution
				tok, sent := start(t, cl, &e, fmt.Sprint("k", i))
				time.Sleep(time.Duration(i*7919%300) * time.Millisecond)
				e.Stop()
				runs <- renewRun{tok, sent, time.Now()}
			})
		}
		wg.Wait()
		time.Sleep(MinLease) // no renewal comes after Stop
		synctest.Wait()
		close(runs)
		renewed := checkRenewedInTime(t, st, runs)
		if renewed < 1000 {
			t.Fatalf("%d renewals in all: the executions did not run long", renewed)
		}
	})
}

// Many short executions (some stopped young, some after renewals, some
// released while they run): each claim is renewed only while it runs (until its
// release), within a third of the lease of its send and of each renewal.
func TestManyExecutionsRenewedInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl, st := minLeaseClaimer(t)
		runs := make(chan renewRun, 4000)
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := range 150 {
					e := new(Execution)
					tok, sent := start(t, cl, e, fmt.Sprint(w, "-", i))
					time.Sleep(time.Duration((w*131+i*7919)%90) * time.Millisecond)
					end := time.Now()
					if i%7 == 3 { // released while it runs (a hijacked connection): renewals stop
						if err := e.Release(); err != nil {
							t.Error(err)
						}
						time.Sleep(time.Duration(i%40) * time.Millisecond)
					}
					e.Stop()
					runs <- renewRun{tok, sent, end}
					if i%50 == 49 {
						time.Sleep(2 * MinLease) // a pause
					}
				}
			})
		}
		wg.Wait()
		time.Sleep(MinLease)
		synctest.Wait()
		close(runs)
		renewed := checkRenewedInTime(t, st, runs)
		if renewed < 1000 {
			t.Fatalf("%d renewals in all", renewed)
		}
	})
}
