package waitset

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestPollBacksOff: Poll checks at once, then after 5, 10, 20 ms..., capped at
// the limit, and returns nil at the first check that finds no live claim.
func TestPollBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var at []time.Duration
		err := Poll(t.Context(), 5*time.Millisecond, 30*time.Millisecond, func(context.Context) (bool, error) {
			at = append(at, time.Since(start))
			return len(at) < 6, nil
		})
		if err != nil {
			t.Fatalf("Poll = %v, want nil", err)
		}
		want := []time.Duration{0, 5, 15, 35, 65, 95}
		if len(at) != len(want) {
			t.Fatalf("checks at %v, want %v ms", at, want)
		}
		for i := range want {
			if at[i] != want[i]*time.Millisecond {
				t.Fatalf("checks at %v, want %v ms", at, want)
			}
		}
	})
}

// TestPollEnds: a context that ends stops Poll with its error; a check error is
// returned as it is; a key without a live claim returns nil with one check.
func TestPollEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		checks := 0
		err := Poll(ctx, 0, 0, func(context.Context) (bool, error) { checks++; return true, nil })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Poll = %v, want DeadlineExceeded", err)
		}
		// 0, 5, 15, 35, 75, 155, 315, 565, 815: the default limit of 250 ms.
		if checks != 9 {
			t.Errorf("%d checks in a second, want 9", checks)
		}
		boom := errors.New("boom")
		if err := Poll(t.Context(), 0, 0, func(context.Context) (bool, error) { return false, boom }); err != boom {
			t.Errorf("Poll with a failing check = %v, want it as is", err)
		}
		checks = 0
		if err := Poll(t.Context(), 0, 0, func(context.Context) (bool, error) { checks++; return false, nil }); err != nil || checks != 1 {
			t.Errorf("Poll of an absent key = %v after %d checks, want nil after 1", err, checks)
		}
	})
}
