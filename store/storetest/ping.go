package storetest

import (
	"testing"

	"github.com/idemkey/idemkey/store"
)

// testPing: a store that implements store.Pinger answers nil when its servers are
// up (never store.ErrDegraded), and a ping changes no record.
func testPing(t *testing.T, s *suite) {
	p, ok := s.Store.(store.Pinger)
	if !ok {
		t.Skip("the store does not implement store.Pinger")
	}
	r := longReq(newID(t), fp("a")) // in flight after the pings, however slow the server
	tok := s.mustClaim(t, r)
	if err := p.Ping(s.ctx); err != nil {
		t.Fatalf("Ping of a live store = %v, want nil", err)
	}
	if err := store.Ping(s.ctx, s.Store); err != nil {
		t.Fatalf("store.Ping = %v, want nil", err)
	}
	s.expect(t, r, store.InFlight)
	s.complete(t, r.ID, tok, sampleResponse())
	equalResponse(t, s.expect(t, r, store.Completed).Record, sampleResponse())
}
