package tiered_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/tiered"
)

// TestWaitUsesBackstop: the tiered store waits on its backstop's notification,
// and says ErrUnsupported when the backstop has none.
func TestWaitUsesBackstop(t *testing.T) {
	mem := memory.New()
	s, err := tiered.New(&fakeCache{}, mem)
	if err != nil {
		t.Fatal(err)
	}
	id := store.ID{Key: "k"}
	res, err := s.Claim(t.Context(), store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("claim: %v %v", res.Outcome, err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait(t.Context(), id) }()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := s.Wait(ctx, id); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a claim in flight = %v, want DeadlineExceeded", err)
	}
	if err := s.Complete(t.Context(), id, res.Token, store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Wait after the completion = %v", err)
	}

	plain, err := tiered.New(&fakeCache{}, struct{ store.Store }{mem})
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Wait(t.Context(), id); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Wait with a backstop that cannot wait = %v, want ErrUnsupported", err)
	}
}
