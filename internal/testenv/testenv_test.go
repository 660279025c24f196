package testenv_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/internal/testenv"
)

// recorder is a testing.TB that records how a test would have ended instead of
// ending it.
type recorder struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recorder) Helper() {}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, fmt.Sprintf(format, args...)
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
}

// TestGetenv: an unset variable skips the test naming it, or fails it naming it
// when CI=true (and only then); a set one is returned whatever CI holds.
func TestGetenv(t *testing.T) {
	const name = "IDEMKEY_TESTENV_PROBE"
	for _, tc := range []struct {
		ci, value  string
		skip, fail bool
	}{
		{ci: "", value: "", skip: true},
		{ci: "false", value: "", skip: true},
		{ci: "1", value: "", skip: true},
		{ci: "true", value: "", fail: true},
		{ci: "", value: "v"},
		{ci: "true", value: "v"},
	} {
		t.Setenv("CI", tc.ci)
		t.Setenv(name, tc.value)
		r := &recorder{TB: t}
		got := testenv.Getenv(r, name, "a probe")
		if r.skipped != tc.skip || r.failed != tc.fail || got != tc.value {
			t.Errorf("CI=%q %s=%q: skipped %v, failed %v, value %q; want skipped %v, failed %v, value %q",
				tc.ci, name, tc.value, r.skipped, r.failed, got, tc.skip, tc.fail, tc.value)
		}
		if (tc.skip || tc.fail) && !strings.Contains(r.msg, name) {
			t.Errorf("CI=%q: message %q does not name %s", tc.ci, r.msg, name)
		}
	}
}
