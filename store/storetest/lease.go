package storetest

import (
	"errors"
	"testing"

	"github.com/idemkey/idemkey/store"
)

func testTakeover(t *testing.T, s *suite) {
	id := newID(t)
	first := s.mustClaim(t, req(id, fpA))
	s.Wait(Lease + slack)
	res := s.expect(t, longReq(id, fpA), store.Claimed)
	if res.Token == first {
		t.Fatal("takeover reused the previous holder's token")
	}
	if !res.Takeover {
		t.Error("Takeover not set")
	}
	// The new holder owns a fresh lease.
	s.expect(t, req(id, fpA), store.InFlight)
}

func testStaleHolderRefused(t *testing.T, s *suite) {
	id := newID(t)
	stale := s.mustClaim(t, req(id, fpA))
	s.Wait(Lease + slack)
	fresh := s.mustClaim(t, longReq(id, fpA))

	staleResp := store.Response{Status: 200, Body: []byte("stale")}
	if err := s.Store.Complete(s.ctx, id, stale, staleResp, Retention); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("stale Complete: %v, want ErrLeaseLost", err)
	}
	if err := s.Store.Renew(s.ctx, id, stale, Lease); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("stale Renew: %v, want ErrLeaseLost", err)
	}
	if err := s.Store.Release(s.ctx, id, stale); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("stale Release: %v, want ErrLeaseLost", err)
	}
	// The stale calls changed nothing: the new holder is still in flight and completes.
	s.expect(t, req(id, fpA), store.InFlight)
	want := store.Response{Status: 200, Body: []byte("fresh")}
	s.complete(t, id, fresh, want)
	res := s.expect(t, req(id, fpA), store.Completed)
	equalResponse(t, res.Record, want)
}

func testReleaseThenReclaim(t *testing.T, s *suite) {
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	if err := s.Store.Release(s.ctx, id, tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Released: the key is new again, even for another payload.
	again := s.mustClaim(t, longReq(id, fpB))
	if again == tok {
		t.Error("reclaim reused the released token")
	}
	if err := s.Store.Release(s.ctx, id, tok); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("second Release with the old token: %v, want ErrLeaseLost", err)
	}
	s.expect(t, req(id, fpB), store.InFlight)
}

func testReleaseAfterComplete(t *testing.T, s *suite) {
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	want := sampleResponse()
	s.complete(t, id, tok, want)
	if err := s.Store.Release(s.ctx, id, tok); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Release after Complete: %v, want ErrLeaseLost", err)
	}
	if err := s.Store.Complete(s.ctx, id, tok, store.Response{Status: 500}, Retention); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("second Complete: %v, want ErrLeaseLost", err)
	}
	res := s.expect(t, req(id, fpA), store.Completed)
	equalResponse(t, res.Record, want)
}

func testRenewExtendsLease(t *testing.T, s *suite) {
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	long := 10 * Lease
	if err := s.Store.Renew(s.ctx, id, tok, long); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	s.Wait(Lease + slack)
	res := s.expect(t, req(id, fpA), store.InFlight)
	if res.RetryAfter <= Lease || res.RetryAfter > long {
		t.Errorf("RetryAfter after renew %v, want within (%v, %v]", res.RetryAfter, Lease, long)
	}
	s.complete(t, id, tok, sampleResponse())
}

func testRenewAfterComplete(t *testing.T, s *suite) {
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	s.complete(t, id, tok, sampleResponse())
	if err := s.Store.Renew(s.ctx, id, tok, Lease); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Renew after Complete: %v, want ErrLeaseLost", err)
	}
	// The refused renewal (one that reached the store after the record, while
	// the completion's answer was on its way) resurrected no claim.
	res := s.expect(t, req(id, fpA), store.Completed)
	equalResponse(t, res.Record, sampleResponse())
}

func testUnknownKey(t *testing.T, s *suite) {
	id := newID(t)
	tok := store.NewToken()
	if err := s.Store.Complete(s.ctx, id, tok, sampleResponse(), Retention); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Complete unknown key: %v, want ErrLeaseLost", err)
	}
	if err := s.Store.Renew(s.ctx, id, tok, Lease); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Renew unknown key: %v, want ErrLeaseLost", err)
	}
	if err := s.Store.Release(s.ctx, id, tok); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Release unknown key: %v, want ErrLeaseLost", err)
	}
	// None of them created a record.
	s.expect(t, req(id, fpA), store.Claimed)
}
