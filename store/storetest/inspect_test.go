package storetest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/storetest"
)

// plain hides the memory store's Inspector: the suite's optional section skips it
// (one open, no failure) and the rest runs as before.
type plain struct{ store.Store }

func TestRunWithoutInspector(t *testing.T) {
	opens := 0 // within the Inspector section
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		if strings.Contains(t.Name(), "/Inspector") {
			opens++
		}
		c := testclock.New(time.Unix(1_700_000_000, 0))
		return storetest.Subject{Store: plain{memory.New(memory.WithClock(c.Now))}, Wait: c.Add}
	})
	if opens != 1 {
		t.Errorf("the Inspector section opened %d stores, want 1 (its probe)", opens)
	}
}
