//go:build !linux

package celeriant_test

import "time"

var start = time.Now()

// threadCPU falls back to wall time where the thread's CPU time is not read.
func threadCPU() time.Duration { return time.Since(start) }
