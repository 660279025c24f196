package idem_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/idem"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// hanging is a store with I/O (its calls run under deadlines) whose Renew and
// Complete hang while shut, like a stopped server: each waits for its deadline
// (then fails, not applied) or for the store to open again.
type hanging struct {
	*memory.Store
	mu   sync.Mutex
	gate chan struct{} // nil: open
}

func (h *hanging) InProcess() bool { return false }

func (h *hanging) set(shut bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case shut && h.gate == nil:
		h.gate = make(chan struct{})
	case !shut && h.gate != nil:
		close(h.gate)
		h.gate = nil
	}
}

func (h *hanging) wait(ctx context.Context) error {
	h.mu.Lock()
	gate := h.gate
	h.mu.Unlock()
	if gate == nil {
		return nil
	}
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *hanging) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	if err := h.wait(ctx); err != nil {
		return err
	}
	return h.Store.Renew(ctx, id, tok, lease)
}

func (h *hanging) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	if err := h.wait(ctx); err != nil {
		return err
	}
	return h.Store.Complete(ctx, id, tok, resp, ret)
}

// A store that stops while fn runs (a renewal in flight when it returns, then
// the completion) delays Do by one store timeout at most: it returns fn's value
// with the result pending; once the store answers, the result is stored in the
// background (in flight until then) and the repeat replays it.
func TestStoreHangsWhileFnRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &hanging{Store: memory.New()}
		const fnTime, bound = 2 * time.Second, time.Second
		// Renewals every 2 s, bounded by 1 s: one is in flight when fn returns.
		r := quiet(t, st, idem.WithLease(6*time.Second), idem.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: bound, Complete: bound, Release: bound}}))
		id := store.ID{Key: "k"}
		t0 := time.Now()
		res, err := r.Do(t.Context(), id, fp, func(context.Context) ([]byte, error) {
			st.set(true)
			time.Sleep(fnTime + bound/2)
			return []byte("v"), nil
		})
		if took := time.Since(t0); err != nil || string(res.Value) != "v" || !res.CompletionPending || took > fnTime+bound/2+bound {
			t.Fatalf("Do = %+v, %v after %v; want fn's value, pending, within %v (fn + one store timeout)", res, err, took, fnTime+bound/2+bound)
		}
		st.set(false)
		if _, err := r.Do(t.Context(), id, fp, func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrInFlight) {
			t.Fatalf("repeat while the result is stored: %v, want ErrInFlight", err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		res, err = r.Do(t.Context(), id, fp, func(context.Context) ([]byte, error) { return nil, nil })
		if err != nil || !res.Replayed || string(res.Value) != "v" {
			t.Fatalf("repeat after the store came back: %+v, %v; want the replay", res, err)
		}
	})
}

// A result whose completion is pending is the background work's own copy: fn
// may return a buffer its caller reuses once Do returns (a pool), and the
// repeat still replays what fn returned, not what the buffer held later. Wait
// returns once the background completion has ended.
func TestPendingResultOwnsItsBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &hanging{Store: memory.New()}
		r := quiet(t, st, idem.WithLease(6*time.Second), idem.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: time.Second, Complete: time.Second, Release: time.Second}}))
		id := store.ID{Key: "k"}
		buf := []byte("first")
		res, err := r.Do(t.Context(), id, fp, func(context.Context) ([]byte, error) {
			st.set(true)
			return buf, nil
		})
		if err != nil || !res.CompletionPending {
			t.Fatalf("Do = %+v, %v; want the result pending", res, err)
		}
		copy(buf, "later") // the caller's buffer, reused
		st.set(false)
		if err := r.Wait(t.Context()); err != nil { // the background completion ends
			t.Fatal(err)
		}
		res, err = r.Do(t.Context(), id, fp, func(context.Context) ([]byte, error) { return nil, nil })
		if err != nil || !res.Replayed || string(res.Value) != "first" {
			t.Fatalf("repeat: %+v %q, %v; want the replay of %q", res, res.Value, err, "first")
		}
	})
}
