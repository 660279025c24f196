package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

func testFirstClaim(t *testing.T, s *suite) {
	id := newID(t)
	res := s.claim(t, req(id, fpA))
	if res.Outcome != store.Claimed || res.Token.IsZero() {
		t.Fatalf("first claim: %+v, want claimed with a token", res)
	}
	if res.Takeover {
		t.Error("first claim reported as a takeover")
	}
	if res.Record != nil {
		t.Error("claimed answer carries a record")
	}
}

// testGivenToken: a claim holds the token its request carries (generated before
// the send, so a claim whose answer was lost can be released by it), on a new key
// and on a takeover alike.
func testGivenToken(t *testing.T, s *suite) {
	id := newID(t)
	r := req(id, fpA)
	r.Token = store.NewToken()
	if res := s.claim(t, r); res.Outcome != store.Claimed || res.Token != r.Token {
		t.Fatalf("claim with token %v: %+v, want claimed holding that token", r.Token, res)
	}
	if err := s.Store.Release(s.ctx, id, r.Token); err != nil {
		t.Fatalf("release with the given token: %v", err)
	}
	r.Token = store.NewToken()
	if res := s.claim(t, r); res.Outcome != store.Claimed || res.Token != r.Token {
		t.Fatalf("claim after release with token %v: %+v, want that token", r.Token, res)
	}
	s.Wait(Lease + slack) // the lease ends: the next claim takes over
	taken := r
	taken.Token = store.NewToken()
	res := s.claim(t, taken)
	if res.Outcome != store.Claimed || !res.Takeover || res.Token != taken.Token {
		t.Fatalf("takeover with token %v: %+v, want a takeover holding that token", taken.Token, res)
	}
	if err := s.Store.Release(s.ctx, id, r.Token); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("release by the taken-over token: %v, want ErrLeaseLost", err)
	}
	if err := s.Store.Renew(s.ctx, id, taken.Token, Lease); err != nil {
		t.Fatalf("renew with the takeover's given token: %v", err)
	}
}

func testReplayAfterComplete(t *testing.T, s *suite) {
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	want := sampleResponse()
	// The retention may count from any moment of the call (completeKept).
	begun := time.Now()
	s.complete(t, id, tok, want)
	took := time.Since(begun)
	for range 2 { // replay is repeatable and does not consume the record
		res := s.expect(t, req(id, fpA), store.Completed)
		equalResponse(t, res.Record, want)
		if res.Record.Fingerprint != fpA {
			t.Errorf("record fingerprint %v, want %v", res.Record.Fingerprint, fpA)
		}
		r := res.Record
		if r.CreatedAt.IsZero() || r.CompletedAt.Before(r.CreatedAt) || !r.ExpiresAt.After(r.CompletedAt) {
			t.Errorf("timestamps out of order: created %v completed %v expires %v", r.CreatedAt, r.CompletedAt, r.ExpiresAt)
		}
		if d := r.ExpiresAt.Sub(r.CompletedAt); d < Retention-took-time.Second || d > Retention+time.Second {
			t.Errorf("retention kept %v, want about %v", d, Retention)
		}
	}
}

func testInFlightDuplicate(t *testing.T, s *suite) {
	id := newID(t)
	r := longReq(id, fpA) // in flight at the next call, however slow the server
	s.mustClaim(t, r)
	res := s.expect(t, r, store.InFlight)
	if res.RetryAfter <= 0 || res.RetryAfter > r.Lease {
		t.Errorf("RetryAfter %v, want within (0, %v]", res.RetryAfter, r.Lease)
	}
}

func testMismatchInFlight(t *testing.T, s *suite) {
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	s.expect(t, req(id, fpB), store.Mismatch)
	// The holder is untouched: it can still complete, and the record is its own.
	want := sampleResponse()
	s.complete(t, id, tok, want)
	res := s.expect(t, req(id, fpA), store.Completed)
	equalResponse(t, res.Record, want)
}

func testMismatchCompleted(t *testing.T, s *suite) {
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	want := sampleResponse()
	s.complete(t, id, tok, want)
	s.expect(t, req(id, fpB), store.Mismatch)
	res := s.expect(t, req(id, fpA), store.Completed)
	equalResponse(t, res.Record, want)
	if res.Record.Fingerprint != fpA {
		t.Error("mismatch changed the stored fingerprint")
	}
}

func testMismatchExpiredLease(t *testing.T, s *suite) {
	// An expired lease is taken over only by the same request.
	id := newID(t)
	s.mustClaim(t, req(id, fpA))
	s.Wait(Lease + slack)
	s.expect(t, req(id, fpB), store.Mismatch)
	res := s.expect(t, req(id, fpA), store.Claimed)
	if !res.Takeover {
		t.Error("claim of an expired lease not reported as a takeover")
	}
}
