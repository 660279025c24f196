//go:build !unix

package cputime

import "time"

// Used returns 0: the process's CPU time is read on Unix only.
func Used() time.Duration { return 0 }
