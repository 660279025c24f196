package store

import (
	"errors"
	"testing"
	"time"
)

func TestEvictPolicyAllows(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	completed := Info{State: StateCompleted, Now: now}
	live := Info{State: StateInFlight, LeaseUntil: now.Add(time.Millisecond), Now: now}
	expired := Info{State: StateInFlight, LeaseUntil: now, Now: now} // a lease ends at its deadline
	absent := Info{Now: now}
	for _, tc := range []struct {
		p                              EvictPolicy
		completed, live, expired, name string
	}{
		{EvictCompleted, "y", "n", "n", "completed"},
		{EvictLeaseExpired, "n", "n", "y", "lease_expired"},
		{EvictLive, "n", "y", "n", "live"},
		{EvictSettled, "y", "n", "y", "completed|lease_expired"},
		{EvictAny, "y", "y", "y", "completed|lease_expired|live"},
		{0, "n", "n", "n", "none"},
	} {
		yn := func(b bool) string { return map[bool]string{true: "y", false: "n"}[b] }
		got := yn(tc.p.Allows(completed)) + yn(tc.p.Allows(live)) + yn(tc.p.Allows(expired))
		if want := tc.completed + tc.live + tc.expired; got != want {
			t.Errorf("%v allows completed, live, expired = %s, want %s", tc.p, got, want)
		}
		if tc.p.Allows(absent) {
			t.Errorf("%v allows removing an absent record", tc.p)
		}
		if tc.p.String() != tc.name {
			t.Errorf("String() = %q, want %q", tc.p.String(), tc.name)
		}
	}
}

func TestEvictPolicyValidate(t *testing.T) {
	for _, p := range []EvictPolicy{0, EvictAny + 1, 0x80} {
		if err := p.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("Validate(%#x) = %v, want ErrInvalid", uint8(p), err)
		}
	}
	if err := ValidateEvict(ID{}, EvictAny); !errors.Is(err, ErrInvalid) {
		t.Errorf("ValidateEvict with an empty key: %v, want ErrInvalid", err)
	}
	if err := ValidateEvict(ID{Key: "k"}, EvictLive); err != nil {
		t.Errorf("ValidateEvict(EvictLive): %v", err)
	}
}

func TestInfoLease(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	live := Info{State: StateInFlight, LeaseUntil: now.Add(1500 * time.Millisecond), Now: now}
	if !live.LeaseLive() || live.LeaseRemaining() != 1500*time.Millisecond {
		t.Errorf("live lease: %v %v", live.LeaseLive(), live.LeaseRemaining())
	}
	// A completed record carrying a stray deadline is not "live".
	done := Info{State: StateCompleted, LeaseUntil: now.Add(time.Hour), Now: now}
	if done.LeaseLive() || done.LeaseRemaining() != 0 {
		t.Error("completed record reported with a live lease")
	}
	for s, name := range map[State]string{StateAbsent: "absent", StateInFlight: "in_flight", StateCompleted: "completed", 9: "unknown"} {
		if s.String() != name {
			t.Errorf("State(%d) = %q, want %q", s, s.String(), name)
		}
	}
}
