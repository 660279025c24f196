package celeriant

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Precision is the unit of a server's batch timestamps (Batch.ServerTimestamp,
// AggregateDetails.LastServerTimestamp, the MinServerTimestamp and MaxServerTimestamp
// filters). A server fixes it at its first start (--timestamp-precision, default
// milliseconds) and refuses to start later with another; the protocol does not tell
// a client which it is (docs/celeriant-protocol.md section 6.8), so a client takes it
// from its configuration and checks it against a timestamp the server sent
// (CheckTimestamp). The zero value is Milliseconds, the server's default.
type Precision uint8

// The server's three precisions.
const (
	Milliseconds Precision = iota // the server's default
	Microseconds
	Nanoseconds
)

// ErrPrecisionMismatch is returned by CheckTimestamp for a server timestamp that does
// not fit the configured Precision.
var ErrPrecisionMismatch = errors.New("celeriant: server timestamp precision mismatch")

// ParsePrecision parses "ms", "us" or "ns" (or the server's own spellings
// "milliseconds", "microseconds", "nanoseconds"; case-insensitive). The empty string
// is Milliseconds. Anything else is an error.
func ParsePrecision(s string) (Precision, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "ms", "milliseconds":
		return Milliseconds, nil
	case "us", "µs", "microseconds":
		return Microseconds, nil
	case "ns", "nanoseconds":
		return Nanoseconds, nil
	}
	return 0, fmt.Errorf("celeriant: timestamp precision %q: want ms, us or ns", s)
}

// Unit returns the duration of one timestamp tick: 1 ms, 1 µs or 1 ns.
func (p Precision) Unit() time.Duration {
	switch p {
	case Microseconds:
		return time.Microsecond
	case Nanoseconds:
		return time.Nanosecond
	}
	return time.Millisecond
}

// String returns "ms", "us" or "ns".
func (p Precision) String() string {
	switch p {
	case Microseconds:
		return "us"
	case Nanoseconds:
		return "ns"
	}
	return "ms"
}

// Duration converts a difference of server timestamps (in ticks) to a duration,
// saturating at the largest time.Duration.
func (p Precision) Duration(ticks uint64) time.Duration {
	u := uint64(p.Unit())
	if ticks > uint64(math.MaxInt64)/u {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(ticks * u)
}

// Ticks converts d to server timestamp ticks, rounding down; a negative d is 0.
func (p Precision) Ticks(d time.Duration) uint64 {
	return uint64(max(d, 0) / p.Unit())
}

// Timestamp returns t as a server timestamp: ticks since the Unix epoch (0 before it).
func (p Precision) Timestamp(t time.Time) uint64 {
	if t.Before(time.Unix(0, 0)) {
		return 0
	}
	switch p {
	case Microseconds:
		return uint64(t.UnixMicro())
	case Nanoseconds:
		return uint64(t.UnixNano())
	}
	return uint64(t.UnixMilli())
}

// CheckTimestamp checks that ts, a timestamp the server stamped, is plausible in
// precision p at the local time now, and returns an error wrapping
// ErrPrecisionMismatch when another precision fits it better: the three precisions
// differ by factors of 1000, so read in the wrong one a current timestamp is
// decades or millennia away from now. It tolerates clock skew and a server epoch
// offset (--timestamp-epoch-offset-secs) that keep ts within a factor of about 30 of
// now's Unix time; a timestamp of 0 (nothing stamped) passes.
func (p Precision) CheckTimestamp(ts uint64, now time.Time) error {
	if ts == 0 {
		return nil
	}
	ref := float64(now.UnixNano())
	best, bestDist := p, math.Inf(1)
	for _, q := range []Precision{Milliseconds, Microseconds, Nanoseconds} {
		dist := math.Abs(math.Log10(float64(ts) * float64(q.Unit()) / ref))
		if dist < bestDist {
			best, bestDist = q, dist
		}
	}
	if best != p {
		return fmt.Errorf("%w: the server stamped %d, which reads as %s in %s but is now in %s: set the server's precision in the configuration",
			ErrPrecisionMismatch, ts, time.Unix(0, 0).Add(p.Duration(ts)).UTC().Format("2006-01-02"), p, best)
	}
	return nil
}
