package cputime

import (
	"runtime"
	"testing"
)

// TestUsedGrowsWithWork: the reading moves forward when the process computes,
// so a cpu-ns/op that reads 0 means no reading, never a free benchmark.
func TestUsedGrowsWithWork(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" || runtime.GOOS == "js" || runtime.GOOS == "wasip1" {
		t.Skip("no CPU time reading on " + runtime.GOOS)
	}
	start := Used()
	x := 0
	for i := range 50_000_000 {
		x ^= i * i
	}
	if Used() <= start {
		t.Fatalf("CPU time did not grow over a busy loop (%d -> %d, x=%d)", start, Used(), x)
	}
}
