//go:build race

package middleware

// raceEnabled: the race detector drops some of what sync.Pool is given, so a
// pooled call is allocated again now and then; allocation counts do not hold.
const raceEnabled = true
