// Package testenv decides, for the tests of every module of the repository, what
// a test does when a server or a tool it needs is missing: on a machine without
// it the test is skipped with a message naming what to set or install; with
// CI=true (.ci/run) it fails instead, so that CI never passes by skipping.
package testenv

import (
	"os"
	"testing"
)

// CI reports whether the tests run in CI (the environment has CI=true): there a
// missing server or tool is a failure, never a skip.
func CI() bool { return os.Getenv("CI") == "true" }

// Missing says that something the test needs is missing: it skips the test with
// the message of format and args, or fails it with that message when CI=true.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if CI() {
		t.Fatalf(format+" (CI=true requires it)", args...)
		return
	}
	t.Skipf(format, args...)
}

// Getenv returns the environment variable name, which points the test at what
// (such as "a Postgres server"). When it is unset the test is skipped with a
// message naming the variable to set, or fails when CI=true.
func Getenv(t testing.TB, name, what string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		Missing(t, "%s is not set; set it to run the tests that need %s", name, what)
	}
	return v
}
