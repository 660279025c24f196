//go:build !unix

package httpload

import "time"

// CPUTime is not measured off Unix: cpu-us/req reads 0.
func CPUTime() time.Duration { return 0 }
