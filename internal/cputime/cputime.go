// Package cputime reads this process's CPU time, for the benchmarks of every
// module of the repository: on a machine shared with other work, wall time
// counts the time a benchmark waited for a core, CPU time only what it ran
// (the garbage collector's workers included), so cpu-ns/op is the figure to
// compare as a ratio within one run.
package cputime

import "testing"

// PerOp starts measuring; the function it returns reports the CPU time used
// since, divided by b.N, as the metric cpu-ns/op. It reports nothing where
// Used is 0 (a platform without the reading) or b.N is 0.
func PerOp(b *testing.B) (stop func()) {
	start := Used()
	return func() {
		if end := Used(); start > 0 && b.N > 0 {
			b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
		}
	}
}
