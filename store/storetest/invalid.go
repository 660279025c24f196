package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// testInvalid: the same bad arguments give ErrInvalid on every store, for every
// call, before the store looks at any record: an empty key, a key over
// store.MaxKeyLen, a scope over store.MaxScopeLen, the zero token, a bad lease,
// retention or status. None of them is ErrLeaseLost, and none disturbs the claim.
func testInvalid(t *testing.T, s *suite) {
	id := newID(t)
	longScope := store.ID{Scope: strings.Repeat("s", store.MaxScopeLen+1), Key: id.Key}
	longKey := store.ID{Scope: id.Scope, Key: strings.Repeat("k", store.MaxKeyLen+1)}
	emptyKey := store.ID{Scope: id.Scope}
	bad := []store.ClaimRequest{
		{ID: emptyKey, Fingerprint: fpA, Lease: Lease, Retention: Retention},
		{ID: longScope, Fingerprint: fpA, Lease: Lease, Retention: Retention},
		{ID: longKey, Fingerprint: fpA, Lease: Lease, Retention: Retention},
		{ID: id, Fingerprint: fpA, Lease: 0, Retention: Retention},
		{ID: id, Fingerprint: fpA, Lease: -Lease, Retention: Retention},
		{ID: id, Fingerprint: fpA, Lease: Lease, Retention: Lease / 2},
	}
	for _, r := range bad {
		if _, err := s.Store.Claim(s.ctx, r); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Claim(scope %d bytes, key %d bytes, lease %v, retention %v): %v, want ErrInvalid",
				len(r.Scope), len(r.Key), r.Lease, r.Retention, err)
		}
	}
	tok := s.mustClaim(t, longReq(id, fpA))
	resp := sampleResponse()
	type call struct {
		name string
		do   func() error
	}
	var calls []call
	for _, h := range []struct {
		name string
		id   store.ID
		tok  store.Token
	}{
		{"zero token", id, store.Token{}},
		{"empty key", emptyKey, tok},
		{"scope over the limit", longScope, tok},
		{"key over the limit", longKey, tok},
	} {
		calls = append(calls,
			call{"Complete, " + h.name, func() error { return s.Store.Complete(s.ctx, h.id, h.tok, resp, Retention) }},
			call{"Release, " + h.name, func() error { return s.Store.Release(s.ctx, h.id, h.tok) }},
			call{"Renew, " + h.name, func() error { return s.Store.Renew(s.ctx, h.id, h.tok, Lease) }},
		)
	}
	calls = append(calls,
		call{"Complete with status 42", func() error { return s.Store.Complete(s.ctx, id, tok, store.Response{Status: 42}, Retention) }},
		call{"Complete with status 1000", func() error { return s.Store.Complete(s.ctx, id, tok, store.Response{Status: 1000}, Retention) }},
		call{"Complete with zero retention", func() error { return s.Store.Complete(s.ctx, id, tok, resp, 0) }},
		call{"Complete with a body marked omitted", func() error {
			return s.Store.Complete(s.ctx, id, tok, store.Response{Status: 200, Body: []byte("x"), BodyOmitted: true}, Retention)
		}},
		call{"Renew with zero lease", func() error { return s.Store.Renew(s.ctx, id, tok, 0) }},
		call{"Renew with negative lease", func() error { return s.Store.Renew(s.ctx, id, tok, -time.Second) }},
	)
	for _, c := range calls {
		if err := c.do(); !errors.Is(err, store.ErrInvalid) || errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("%s: %v, want ErrInvalid", c.name, err)
		}
	}
	// The rejected calls left the claim in place, held by tok.
	s.expect(t, req(id, fpA), store.InFlight)
	s.complete(t, id, tok, resp)
	equalResponse(t, s.expect(t, req(id, fpA), store.Completed).Record, resp)
}
