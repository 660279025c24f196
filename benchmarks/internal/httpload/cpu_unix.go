//go:build unix

package httpload

import (
	"syscall"
	"time"
)

// CPUTime returns the CPU time (user and system) the process has used so far.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
