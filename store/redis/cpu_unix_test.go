//go:build unix

package redis

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time (user and system) the process has used so far,
// and true; on a shared machine it measures the work of a run whose wall time
// other processes stretch.
func cpuTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
