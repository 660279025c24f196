package celeriant_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkey/idemkey/celeriant"
)

// TestPrecision: parsing, conversions and the mismatch check of a server's timestamp
// precision (docs/celeriant-protocol.md section 6.8).
func TestPrecision(t *testing.T) {
	for in, want := range map[string]celeriant.Precision{"": celeriant.Milliseconds, "ms": celeriant.Milliseconds,
		"US": celeriant.Microseconds, "nanoseconds": celeriant.Nanoseconds, " ns ": celeriant.Nanoseconds} {
		if got, err := celeriant.ParsePrecision(in); err != nil || got != want {
			t.Errorf("ParsePrecision(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := celeriant.ParsePrecision("s"); err == nil {
		t.Error("ParsePrecision(s) accepted")
	}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	all := []celeriant.Precision{celeriant.Milliseconds, celeriant.Microseconds, celeriant.Nanoseconds}
	for _, p := range all {
		if got := p.Ticks(90 * time.Second); p.Duration(got) != 90*time.Second {
			t.Errorf("%s: 90 s is %d ticks, back %v", p, got, p.Duration(got))
		}
		if p.Ticks(-time.Second) != 0 {
			t.Errorf("%s: a negative duration is not 0 ticks", p)
		}
		ts := p.Timestamp(now)
		if back := time.Unix(0, 0).Add(p.Duration(ts)); !back.Equal(now) {
			t.Errorf("%s: timestamp %d reads back as %v", p, ts, back)
		}
		for _, q := range all {
			err := q.CheckTimestamp(ts, now.Add(time.Hour))
			if (err != nil) != (p != q) || err != nil && !errors.Is(err, celeriant.ErrPrecisionMismatch) {
				t.Errorf("server %s, configured %s: %v", p, q, err)
			}
		}
		// A server epoch offset of ten years and some clock skew still pass.
		if err := p.CheckTimestamp(p.Timestamp(now.AddDate(-10, 0, 0).Add(-time.Minute)), now); err != nil {
			t.Errorf("%s with an epoch offset: %v", p, err)
		}
	}
	if celeriant.Milliseconds.Duration(1<<63) != time.Duration(1<<63-1) {
		t.Error("Duration does not saturate")
	}
	if err := celeriant.Nanoseconds.CheckTimestamp(0, now); err != nil {
		t.Errorf("timestamp 0: %v", err)
	}
}
