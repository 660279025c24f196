package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres/pgtest"
)

// cluster is a private Postgres cluster (package pgtest) for the tests that stop,
// hang, crash or fail over the server.
type cluster struct{ *pgtest.Cluster }

// startCluster starts a private cluster (pgtest.Start: skipped with -short, and
// without the Postgres server binaries unless CI=true).
func startCluster(t testing.TB) *cluster { return &cluster{pgtest.Start(t)} }

// url is the cluster's URL with a 2 s connect timeout.
func (c *cluster) url() string { return c.URL() + "&connect_timeout=2" }

// TestRestartDuringClaims runs clients through the claim/execute/complete cycle
// while the private server is crashed (immediate stop) and restarted, then stopped
// cleanly and restarted. Every request ends with exactly one answer it can trust:
// a completion or a replay of the stored response. A handler runs again only after
// the Complete of an earlier run failed with a store error (its lease then expires
// and the retry takes over, as designed); a completed key is never executed again;
// and no key stays blocked past its lease.
func TestRestartDuringClaims(t *testing.T) {
	c := startCluster(t)
	ctx := t.Context()
	pool := newPool(t, c.url(), func(cfg *pgxpool.Config) { cfg.MaxConns = 8 })
	s, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	const (
		workers   = 8
		lease     = 400 * time.Millisecond
		retention = time.Hour
	)
	type keyState struct {
		executions      int
		failedCompletes int
		body            []byte // the response the client got (completion or replay)
	}
	var (
		mu          sync.Mutex
		keys        = map[store.ID]*keyState{}
		storeErrors int
		stopIssuing = make(chan struct{})
		deadline    = time.Now().Add(25 * time.Second)
		wg          sync.WaitGroup
	)
	// request plays one client request for id until it gets an answer, retrying
	// after store errors (503) and in-flight answers (409, after Retry-After).
	request := func(id store.ID) error {
		st := &keyState{}
		mu.Lock()
		keys[id] = st
		mu.Unlock()
		r := store.ClaimRequest{ID: id, Fingerprint: fingerprint("req"), Lease: lease, Retention: retention}
		for {
			if time.Now().After(deadline) {
				return fmt.Errorf("key %s still has no answer at the deadline (wedged?)", id.Key)
			}
			actx, cancel := context.WithTimeout(ctx, time.Second)
			res, err := s.Claim(actx, r)
			if err == nil && res.Outcome == store.Claimed {
				mu.Lock()
				st.executions++
				body := fmt.Appendf(nil, "%s run %d", id.Key, st.executions)
				mu.Unlock()
				err = s.Complete(actx, id, res.Token, store.Response{Status: 201, Body: body}, retention)
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					st.body = body
				case errors.Is(err, store.ErrLeaseLost):
					st.failedCompletes++ // our lease ran out while the server was down
				default:
					st.failedCompletes++
					storeErrors++
				}
				mu.Unlock()
				if err == nil {
					return nil
				}
				time.Sleep(20 * time.Millisecond) // the client's back-off after a 503
				continue
			}
			cancel()
			switch {
			case err != nil:
				mu.Lock()
				storeErrors++
				mu.Unlock()
				time.Sleep(20 * time.Millisecond) // the client's back-off after a 503
			case res.Outcome == store.Completed:
				mu.Lock()
				st.body = res.Record.Body
				mu.Unlock()
				return nil
			case res.Outcome == store.InFlight:
				time.Sleep(res.RetryAfter) // Retry-After of the 409
			default:
				return fmt.Errorf("key %s: unexpected outcome %v", id.Key, res.Outcome)
			}
		}
	}
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stopIssuing:
					return
				default:
				}
				if err := request(store.ID{Scope: "restart", Key: fmt.Sprintf("w%d-%d", w, i)}); err != nil {
					errs <- err
					return
				}
			}
		})
	}

	time.Sleep(time.Second) // let claims flow before the crash
	c.Stop("immediate")
	time.Sleep(300 * time.Millisecond)
	c.Start()
	time.Sleep(time.Second)
	c.Stop("fast")
	time.Sleep(300 * time.Millisecond)
	c.Start()
	time.Sleep(500 * time.Millisecond)
	close(stopIssuing)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Every key replays the response its client got, and ran no more often than
	// its failed completions allow.
	reexecuted := 0
	for id, st := range keys {
		if st.executions > 1+st.failedCompletes {
			t.Errorf("key %s ran %d times with %d failed completions", id.Key, st.executions, st.failedCompletes)
		}
		if st.executions > 1 {
			reexecuted++
		}
		res, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("req"), Lease: lease, Retention: retention})
		switch {
		case err != nil:
			t.Errorf("final replay of %s: %v", id.Key, err)
		case res.Outcome != store.Completed:
			t.Errorf("final replay of %s: %v, want completed", id.Key, res.Outcome)
		case !bytes.Equal(res.Record.Body, st.body):
			t.Errorf("key %s replays %q but its client got %q", id.Key, res.Record.Body, st.body)
		}
	}
	t.Logf("%d requests, %d store errors seen by clients, %d keys run again after a failed completion",
		len(keys), storeErrors, reexecuted)
	if storeErrors == 0 {
		t.Error("no client saw a store error: the restarts were not observed")
	}
}
