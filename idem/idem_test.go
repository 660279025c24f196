package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/idem"
	"github.com/idemkey/idemkey/idem/idemtest"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

func TestConformanceMemory(t *testing.T) {
	idemtest.Run(t, func(t *testing.T) store.Store { return memory.New() })
}

func TestNewRejectsMisconfiguration(t *testing.T) {
	st := memory.New()
	for _, tc := range []struct {
		name string
		st   store.Store
		opts []idem.Option
	}{
		{"nil store", nil, nil},
		{"negative lease", st, []idem.Option{idem.WithLease(-time.Second)}},
		// Renewal ticks every third of the lease: 2 ns would make a zero interval.
		{"lease of 2ns", st, []idem.Option{idem.WithLease(2 * time.Nanosecond)}},
		{"lease under MinLease", st, []idem.Option{idem.WithLease(claim.MinLease - time.Millisecond)}},
		{"retention below lease", st, []idem.Option{idem.WithLease(time.Minute), idem.WithRecordRetention(policy.RetentionRule{Default: time.Second})}},
		{"negative store timeout", st, []idem.Option{idem.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: -1}})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r, err := idem.New(tc.st, tc.opts...); err == nil || r != nil {
				t.Fatalf("New = %v, %v; want an error", r, err)
			}
		})
	}
	if _, err := idem.New(st); err != nil {
		t.Fatalf("New with defaults: %v", err)
	}
}

// faulty wraps a store and fails the calls named in fail.
type faulty struct {
	store.Store
	claim, complete, release error
	failCompletes            atomic.Int32 // Complete fails with errDown this many times first
	completes, releases      atomic.Int32
}

var errDown = errors.New("store down")

func (f *faulty) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if f.claim != nil {
		return store.ClaimResult{}, f.claim
	}
	return f.Store.Claim(ctx, req)
}

func (f *faulty) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	f.completes.Add(1)
	if f.complete != nil {
		return f.complete
	}
	if f.failCompletes.Add(-1) >= 0 {
		return errDown
	}
	return f.Store.Complete(ctx, id, tok, resp, ret)
}

func (f *faulty) Release(ctx context.Context, id store.ID, tok store.Token) error {
	f.releases.Add(1)
	if f.release != nil {
		return f.release
	}
	return f.Store.Release(ctx, id, tok)
}

func quiet(t *testing.T, st store.Store, opts ...idem.Option) *idem.Runner {
	t.Helper()
	r, err := idem.New(st, append([]idem.Option{idem.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var fp = idem.Fingerprint([]byte("args"))

func TestNilFnRefused(t *testing.T) {
	mem := memory.New()
	id := store.ID{Key: "k"}
	if _, err := quiet(t, mem).Do(t.Context(), id, fp, nil); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("Do(nil fn): %v, want store.ErrInvalid", err)
	}
	// Nothing was claimed: a real call runs.
	if res, err := quiet(t, mem).Do(t.Context(), id, fp, func(context.Context) ([]byte, error) { return []byte("v"), nil }); err != nil || res.Replayed {
		t.Fatalf("Do after a refused nil fn = %+v, %v", res, err)
	}
}

func TestClaimFailureDoesNotRun(t *testing.T) {
	r := quiet(t, &faulty{Store: memory.New(), claim: errDown})
	_, err := r.Do(t.Context(), store.ID{Key: "k"}, fp, func(context.Context) ([]byte, error) {
		t.Error("fn ran although the store could not answer")
		return nil, nil
	})
	if !errors.Is(err, errDown) {
		t.Fatalf("Do: %v, want the store's error wrapped", err)
	}
}

// A completion the store refuses ends Do with fn's value and the store's error;
// one it fails to answer is retried in the background for at most one lease, and
// either way the key stays claimed (in flight), never run twice at once, until
// the lease ends.
func TestCompleteFailureKeepsClaimUntilLease(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		pending bool
	}{{"refused", fmt.Errorf("%w: too large", store.ErrInvalid), false}, {"failed", errDown, true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memory.New()
				const lease = 300 * time.Millisecond
				r := quiet(t, &faulty{Store: mem, complete: tc.err}, idem.WithLease(lease))
				id := store.ID{Key: "k"}
				res, err := r.Do(t.Context(), id, fp, func(context.Context) ([]byte, error) { return []byte("v"), nil })
				if string(res.Value) != "v" || res.CompletionPending != tc.pending || tc.pending != (err == nil) || !tc.pending && !errors.Is(err, tc.err) {
					t.Fatalf("Do = %+v, %v; want fn's value, pending %v", res, err, tc.pending)
				}
				// Not released: a repeat is in flight, never run twice at once.
				if _, err := quiet(t, mem).Do(t.Context(), id, fp, func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrInFlight) {
					t.Fatalf("repeat: %v, want ErrInFlight", err)
				}
				time.Sleep(3 * lease) // the retries give up; the last renewal's lease ends
				ran := false
				if _, err := quiet(t, mem).Do(t.Context(), id, fp, func(context.Context) ([]byte, error) { ran = true; return nil, nil }); err != nil || !ran {
					t.Fatalf("after the lease: %v, ran %v; want a new run", err, ran)
				}
			})
		})
	}
}

// A completion that fails is retried in the background: Do returns after its
// one attempt with the result pending, and the repeat then replays it.
func TestCompleteRetried(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fails int32
	}{
		{"one failure", 1},
		{"two failures", 2},
		{"four failures", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &faulty{Store: memory.New()}
				f.failCompletes.Store(tc.fails)
				r := quiet(t, f)
				id := store.ID{Key: "k"}
				res, err := r.Do(t.Context(), id, fp, func(context.Context) ([]byte, error) { return []byte("v"), nil })
				if err != nil || !res.CompletionPending || f.completes.Load() != 1 {
					t.Fatalf("Do: %+v, %v after %d Complete calls; want pending after one", res, err, f.completes.Load())
				}
				time.Sleep(time.Second)
				synctest.Wait()
				if f.completes.Load() != tc.fails+1 {
					t.Fatalf("%d Complete calls, want %d", f.completes.Load(), tc.fails+1)
				}
				res, err = r.Do(t.Context(), id, fp, func(context.Context) ([]byte, error) { return nil, errors.New("ran twice") })
				if err != nil || !res.Replayed || string(res.Value) != "v" {
					t.Fatalf("replay = %+v, %v", res, err)
				}
			})
		})
	}
}

func TestCallerCancelledStillReleases(t *testing.T) {
	mem := memory.New()
	f := &faulty{Store: mem}
	r := quiet(t, f)
	ctx, cancel := context.WithCancel(t.Context())
	id := store.ID{Key: "k"}
	_, err := r.Do(ctx, id, fp, func(ctx context.Context) ([]byte, error) {
		cancel()
		return nil, ctx.Err()
	})
	if !errors.Is(err, context.Canceled) || f.releases.Load() != 1 {
		t.Fatalf("Do: %v, releases %d; want the caller's cancellation and one release", err, f.releases.Load())
	}
	var ran bool
	if _, err := r.Do(t.Context(), id, fp, func(context.Context) ([]byte, error) { ran = true; return nil, nil }); err != nil || !ran {
		t.Fatalf("after a cancelled call: ran=%v, %v; want fn to run", ran, err)
	}
}

func TestForeignRecordIsCorrupt(t *testing.T) {
	mem := memory.New()
	id := store.ID{Scope: "http", Key: "k"}
	req := store.ClaimRequest{ID: id, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour}
	c, err := mem.Claim(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if err := mem.Complete(t.Context(), id, c.Token, store.Response{Status: 201, Body: []byte("{}")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	_, err = quiet(t, mem).Do(t.Context(), id, fp, func(context.Context) ([]byte, error) { return nil, nil })
	if !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("Do over an HTTP record: %v, want store.ErrCorrupt", err)
	}
}

// TestRenewalOnFakeTime runs fn for ten leases on synctest's clock: without
// renewal the memory store (on the same clock) would let a repeat take over.
func TestRenewalOnFakeTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		r := quiet(t, mem, idem.WithLease(time.Second))
		id := store.ID{Key: "slow"}
		var runs atomic.Int32
		res, err := r.Do(t.Context(), id, fp, func(ctx context.Context) ([]byte, error) {
			runs.Add(1)
			for range 20 {
				time.Sleep(500 * time.Millisecond)
				_, err := r.Do(ctx, id, fp, func(context.Context) ([]byte, error) { runs.Add(1); return nil, nil })
				var inflight *idem.InFlightError
				if !errors.As(err, &inflight) || inflight.RetryAfter <= 0 || inflight.RetryAfter > time.Second {
					return nil, fmt.Errorf("repeat during a long call: %v", err)
				}
			}
			return []byte("done"), nil
		})
		if err != nil || string(res.Value) != "done" || runs.Load() != 1 {
			t.Fatalf("Do = %q, %v, runs %d", res.Value, err, runs.Load())
		}
	})
}
