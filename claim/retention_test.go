package claim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// keptFor claims id, sets the record's retention to d through its context, and
// returns how long the store keeps the completed record and what FromContext
// reported before completion.
func keptFor(t *testing.T, cl *claim.Claimer, st *memory.Store, key string, d time.Duration) (kept, reported time.Duration) {
	t.Helper()
	id := store.ID{Key: key}
	res, sent, err := cl.Claim(t.Context(), store.ClaimRequest{ID: id})
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Claim: %+v %v", res, err)
	}
	var e claim.Execution
	e.Start(cl, t.Context(), id, res.Token, sent, nil)
	ctx := claim.NewContext(t.Context(), claim.Claim{ID: id, Token: res.Token, Retention: cl.Retention()}, &e)
	if err := claim.SetRetention(ctx, d); err != nil {
		t.Fatal(err)
	}
	c, _ := claim.FromContext(ctx)
	e.Stop()
	e.Returned()
	if _, err := e.Complete(store.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if err := claim.SetRetention(ctx, time.Minute); !errors.Is(err, claim.ErrNoClaim) {
		t.Errorf("SetRetention after the execution returned: %v", err)
	}
	info, err := st.Inspect(t.Context(), id)
	if err != nil || info.State != store.StateCompleted {
		t.Fatalf("Inspect: %+v %v", info, err)
	}
	return info.ExpiresAt.Sub(info.CompletedAt), c.Retention
}

func TestSetRetention(t *testing.T) {
	st := memory.New()
	cl, err := claim.New(claim.Config{Store: st, Lease: time.Second, Retention: time.Hour, MaxRetention: 48 * time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key       string
		set, want time.Duration
	}{
		{"short", 10 * time.Minute, 10 * time.Minute},
		{"long", 30 * time.Hour, 30 * time.Hour},
		{"clamped", 30 * 24 * time.Hour, 48 * time.Hour},
	} {
		kept, reported := keptFor(t, cl, st, tc.key, tc.set)
		if kept != tc.want || reported != tc.want {
			t.Errorf("%s: SetRetention(%v): kept %v, FromContext %v; want %v", tc.key, tc.set, kept, reported, tc.want)
		}
	}
	def := newClaimer(t, st, time.Second) // MaxRetention 0: the retention, an hour
	if kept, _ := keptFor(t, def, st, "default-max", 30*time.Hour); kept != time.Hour {
		t.Errorf("kept %v, want the retention (the default maximum)", kept)
	}
}

func TestSetRetentionRefused(t *testing.T) {
	if err := claim.SetRetention(context.Background(), time.Hour); !errors.Is(err, claim.ErrNoClaim) {
		t.Errorf("no claim: %v", err)
	}
	ctx := claim.NewContext(context.Background(), claim.Claim{ID: store.ID{Key: "k"}}, &claim.Execution{})
	if err := claim.SetRetention(ctx, 0); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("zero: %v", err)
	}
	for _, max := range []time.Duration{-time.Hour, time.Minute} {
		if _, err := claim.New(claim.Config{Store: memory.New(), Lease: time.Second, Retention: time.Hour, MaxRetention: max}); err == nil {
			t.Errorf("MaxRetention %v accepted", max)
		}
	}
}
