package tiered_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/tiered"
)

// TestNewRefusesMisconfiguration: a nil cache or backstop, a negative timeout or
// cooldown fail New with store.ErrInvalid; zero means the default (timeout) or
// no pause (cooldown).
func TestNewRefusesMisconfiguration(t *testing.T) {
	fast, back := memory.New(), memory.New()
	var nilCache *memory.Store
	for name, c := range map[string]struct {
		fast tiered.Cache
		back store.Store
		opts []tiered.Option
	}{
		"nil cache":         {nil, back, nil},
		"nil pointer cache": {nilCache, back, nil},
		"nil backstop":      {fast, nil, nil},
		"negative timeout":  {fast, back, []tiered.Option{tiered.WithTimeout(-time.Nanosecond)}},
		"negative cooldown": {fast, back, []tiered.Option{tiered.WithCooldown(-time.Second)}},
	} {
		if _, err := tiered.New(c.fast, c.back, c.opts...); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := tiered.New(fast, back, tiered.WithTimeout(0), tiered.WithCooldown(0)); err != nil {
		t.Errorf("zero timeout and cooldown: %v", err)
	}
}
