//go:build !unix

package redis

import "time"

// cpuTime reports false: the process's CPU time is read on Unix only.
func cpuTime() (time.Duration, bool) { return 0, false }
