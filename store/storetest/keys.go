package storetest

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

func testScopesIsolated(t *testing.T, s *suite) {
	key := "shared-" + store.NewToken().String()
	alice := store.ID{Scope: "alice", Key: key}
	bob := store.ID{Scope: "bob", Key: key}
	// Scopes that would collide if joined naively.
	tricky := []store.ID{{Scope: "a", Key: "b:" + key}, {Scope: "a:b", Key: key}, {Scope: "", Key: "a:b:" + key}}

	tokA := s.mustClaim(t, req(alice, fpA))
	s.mustClaim(t, longReq(bob, fpB)) // another principal, another payload: no mismatch
	s.complete(t, alice, tokA, store.Response{Status: 200, Body: []byte("alice")})
	s.expect(t, req(bob, fpB), store.InFlight)
	for _, id := range tricky {
		s.mustClaim(t, req(id, fpA))
	}
	got := s.expect(t, req(alice, fpA), store.Completed)
	if string(got.Record.Body) != "alice" {
		t.Errorf("alice replays %q", got.Record.Body)
	}
}

// testLimitsAccepted: a scope of exactly store.MaxScopeLen bytes and a key of
// exactly store.MaxKeyLen bytes, any bytes, are accepted and kept apart from
// their neighbours.
func testLimitsAccepted(t *testing.T, s *suite) {
	id := store.ID{Scope: strings.Repeat("\x00s}", store.MaxScopeLen/3) + strings.Repeat("x", store.MaxScopeLen%3),
		Key: strings.Repeat("k", store.MaxKeyLen-len(t.Name())) + t.Name()}
	if len(id.Scope) != store.MaxScopeLen || len(id.Key) != store.MaxKeyLen {
		t.Fatalf("test ID of %d and %d bytes", len(id.Scope), len(id.Key))
	}
	tok := s.mustClaim(t, longReq(id, fpA))
	if err := s.Store.Renew(s.ctx, id, tok, 5*time.Second); err != nil {
		t.Fatalf("Renew at the limits: %v", err)
	}
	s.complete(t, id, tok, sampleResponse())
	s.expect(t, req(id, fpA), store.Completed)
	other := store.ID{Scope: id.Scope[:store.MaxScopeLen-1], Key: id.Key}
	s.expect(t, req(other, fpB), store.Claimed)
}
