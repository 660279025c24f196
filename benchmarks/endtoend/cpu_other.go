//go:build !unix

package main

import "time"

// cpuTime is not measured off Unix: cpu-us/req reads 0.
func cpuTime() time.Duration { return 0 }
