package storetest

import (
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// testCompleteRetention checks that the retention given to Complete, not the
// claim's, decides how long a completed record lives, in both directions: a
// handler may shorten its record's life (a failed validation kept minutes) or
// lengthen it (a payment kept a month; claim.SetRetention).
func testCompleteRetention(t *testing.T, s *suite) {
	long := 30 * 24 * time.Hour
	lengthened := newID(t)
	tok := s.mustClaim(t, req(lengthened, fpA)) // claimed for Retention (10 s)
	s.completeKept(t, lengthened, tok, long, time.Second)

	shortened := newID(t)
	short := 3 * Lease
	tok = s.mustClaim(t, req(shortened, fpA))
	s.completeKept(t, shortened, tok, short, slack)
	s.Wait(short + slack)
	// Past the shorter retention the key is new, though the claim asked for more.
	s.expect(t, req(shortened, fpB), store.Claimed)
	s.expect(t, req(lengthened, fpA), store.Completed)
}

// completeKept completes id's claim with retention and checks that the record then
// read back is kept for that retention, within tolerance. A store may count the
// retention from any moment of the Complete call (store/tiered caches its copy for
// the retention less the time the backstop took, so that it never outlives the
// backstop's record): the record is kept at most the retention and at least the
// retention less the call's duration, whatever the machine's load.
func (s *suite) completeKept(t *testing.T, id store.ID, tok store.Token, retention, tolerance time.Duration) {
	t.Helper()
	begun := time.Now()
	if err := s.Store.Complete(s.ctx, id, tok, sampleResponse(), retention); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	took := time.Since(begun)
	rec := s.expect(t, req(id, fpA), store.Completed).Record
	if d := rec.ExpiresAt.Sub(rec.CompletedAt); d < retention-took-tolerance || d > retention+tolerance {
		t.Errorf("completed with a retention of %v in %v: kept %v", retention, took, d)
	}
}

func testRetentionExpiry(t *testing.T, s *suite) {
	id := newID(t)
	short := 3 * Lease
	r := store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: Lease, Retention: short}
	tok := s.mustClaim(t, r)
	if err := s.Store.Complete(s.ctx, id, tok, sampleResponse(), short); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	s.expect(t, r, store.Completed)
	s.Wait(short + slack)
	// Past retention the key is new again, for any payload.
	res := s.expect(t, store.ClaimRequest{ID: id, Fingerprint: fpB, Lease: Lease, Retention: short}, store.Claimed)
	if res.Takeover {
		t.Error("claim of an expired record reported as a takeover")
	}
}

func testInFlightRetentionExpiry(t *testing.T, s *suite) {
	// A claim never completed nor released is forgotten after its retention: the
	// key is new again (not a takeover), even for another payload.
	id := newID(t)
	short := 3 * Lease
	s.mustClaim(t, store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: Lease, Retention: short})
	s.Wait(short + slack)
	res := s.expect(t, store.ClaimRequest{ID: id, Fingerprint: fpB, Lease: Lease, Retention: short}, store.Claimed)
	if res.Takeover {
		t.Error("claim after the retention of an abandoned claim reported as a takeover")
	}
}
