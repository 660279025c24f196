// Package storetest is the conformance suite of the store contract
// (docs/architecture.md section 4). Every backend runs it with one call from its own tests:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Subject {
//			return storetest.Subject{Store: newEmptyStore(t)}
//		})
//	}
//
// Stores that implement store.Inspector also run the optional "Inspector" section
// (inspect and evict one key); it is skipped for the others.
//
// Leases in the suite are tens of milliseconds so it stays fast against real
// servers; stores with an injectable clock pass Subject.Wait to advance it instead
// of sleeping.
package storetest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Subject is one fresh, empty store under test.
type Subject struct {
	// Store is the backend under test. It must be empty (its own namespace) and be
	// cleaned up by the opener with t.Cleanup.
	Store store.Store
	// Wait lets d pass on the store's clock. Nil means time.Sleep, for stores whose
	// deadlines run on a server's real clock.
	Wait func(d time.Duration)
	// SealsAnew is set for a store that keeps each completion's response sealed
	// with a fresh nonce (store/encrypted): it cannot tell a record completed by
	// the same token with the same response from another, so
	// CompleteAgainSameToken only checks that a repeated completion changes
	// nothing.
	SealsAnew bool
	// MaxBody, when positive, is the body size above which the store keeps a
	// record with its body omitted (store.Response.BodyOmitted) instead of the
	// body: store/dynamodb, whose items are limited to 400 KB. BodiesRoundTrip
	// then expects its larger bodies back omitted. 0: every body round trips.
	MaxBody int
}

// Durations used by the suite. Lease is short so expiry tests stay fast, yet long
// enough that two calls in a row fit in it on a loaded CI machine; slack absorbs
// clock granularity between the test process and a store's server.
const (
	Lease     = 150 * time.Millisecond
	Retention = 10 * time.Second
	slack     = 50 * time.Millisecond
)

// Run runs the whole conformance suite against the stores open returns; open is
// called once per subtest.
func Run(t *testing.T, open func(t *testing.T) Subject) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			if s.Store == nil {
				t.Fatal("storetest: open returned a nil Store")
			}
			if s.Wait == nil {
				s.Wait = time.Sleep
			}
			tc.run(t, &suite{Subject: s, ctx: t.Context()})
		})
	}
	runInspector(t, open)
}

type suite struct {
	Subject
	ctx context.Context
}

var cases = []struct {
	name string
	run  func(t *testing.T, s *suite)
}{
	{"FirstClaim", testFirstClaim},
	{"GivenTokenHeld", testGivenToken},
	{"ReplayAfterComplete", testReplayAfterComplete},
	{"InFlightDuplicate", testInFlightDuplicate},
	{"MismatchInFlight", testMismatchInFlight},
	{"MismatchCompleted", testMismatchCompleted},
	{"MismatchExpiredLease", testMismatchExpiredLease},
	{"TakeoverAfterLeaseExpiry", testTakeover},
	{"StaleHolderRefused", testStaleHolderRefused},
	{"ReleaseThenReclaim", testReleaseThenReclaim},
	{"ReleaseAfterCompleteRefused", testReleaseAfterComplete},
	{"CompleteAgainSameToken", testCompleteAgain},
	{"RenewExtendsLease", testRenewExtendsLease},
	{"RenewAfterCompleteRefused", testRenewAfterComplete},
	{"UnknownKeyRefused", testUnknownKey},
	{"RetentionExpiry", testRetentionExpiry},
	{"CompleteRetentionDecides", testCompleteRetention},
	{"ScopesIsolated", testScopesIsolated},
	{"ConcurrentClaimOneWinner", testConcurrentClaim},
	{"ConcurrentTakeoverOneWinner", testConcurrentTakeover},
	{"CompleteCopiesResponse", testCompleteCopies},
	{"RecordUnchangedAfterReturn", testRecordUnchanged},
	{"InFlightRetentionExpiry", testInFlightRetentionExpiry},
	{"BodiesRoundTrip", testBodiesRoundTrip},
	{"OmittedBody", testOmittedBody},
	{"InvalidArguments", testInvalid},
	{"PingLive", testPing},
	{"LimitsAccepted", testLimitsAccepted},
	{"WaitNoLiveClaim", testWaitNoLiveClaim},
	{"WaitBlocksInFlight", testWaitBlocksInFlight},
	{"WaitWakes", testWaitWakes},
}

func fp(s string) store.Fingerprint {
	var f store.Fingerprint
	copy(f[:], s)
	return f
}

var (
	fpA = fp("request-a")
	fpB = fp("request-b")
)

func req(id store.ID, f store.Fingerprint) store.ClaimRequest {
	return store.ClaimRequest{ID: id, Fingerprint: f, Lease: Lease, Retention: Retention}
}

// longReq is req with a lease that cannot expire during the test: for a holder
// the test then expects to be in flight after several round trips to a real,
// possibly slow, server.
func longReq(id store.ID, f store.Fingerprint) store.ClaimRequest {
	r := req(id, f)
	r.Lease = 5 * time.Second
	return r
}

func newID(t *testing.T) store.ID {
	return store.ID{Scope: "tenant-" + t.Name(), Key: "key-" + store.NewToken().String()}
}

func (s *suite) claim(t *testing.T, r store.ClaimRequest) store.ClaimResult {
	t.Helper()
	res, err := s.Store.Claim(s.ctx, r)
	if err != nil {
		t.Fatalf("Claim(%q): %v", r.Key, err)
	}
	return res
}

func (s *suite) mustClaim(t *testing.T, r store.ClaimRequest) store.Token {
	t.Helper()
	res := s.claim(t, r)
	if res.Outcome != store.Claimed {
		t.Fatalf("Claim: outcome %v, want claimed", res.Outcome)
	}
	if res.Token.IsZero() {
		t.Fatal("Claim: claimed with the zero token")
	}
	return res.Token
}

func (s *suite) expect(t *testing.T, r store.ClaimRequest, want store.Outcome) store.ClaimResult {
	t.Helper()
	res := s.claim(t, r)
	if res.Outcome != want {
		t.Fatalf("Claim: outcome %v, want %v", res.Outcome, want)
	}
	if want != store.Claimed && !res.Token.IsZero() {
		t.Fatalf("Claim: %v answer carries a token", want)
	}
	return res
}

func (s *suite) complete(t *testing.T, id store.ID, tok store.Token, resp store.Response) {
	t.Helper()
	if err := s.Store.Complete(s.ctx, id, tok, resp, Retention); err != nil {
		t.Fatalf("Complete: %v", err)
	}
}

func sampleResponse() store.Response {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/payments/42")
	h.Add("X-Multi", "one")
	h.Add("X-Multi", "two")
	return store.Response{Status: 201, Header: h, Body: []byte(`{"id":42}`)}
}

func equalResponse(t *testing.T, got *store.Record, want store.Response) {
	t.Helper()
	if got == nil {
		t.Fatal("completed answer without a record")
	}
	if got.Status != want.Status {
		t.Errorf("status %d, want %d", got.Status, want.Status)
	}
	if !bytes.Equal(got.Body, want.Body) {
		t.Errorf("body differs: %d bytes, want %d", len(got.Body), len(want.Body))
	}
	if got.BodyOmitted != want.BodyOmitted {
		t.Errorf("BodyOmitted %v, want %v", got.BodyOmitted, want.BodyOmitted)
	}
	if len(got.Header) != len(want.Header) {
		t.Errorf("headers %v, want %v", got.Header, want.Header)
	}
	for name, vals := range want.Header {
		if fmt.Sprint(got.Header[name]) != fmt.Sprint(vals) {
			t.Errorf("header %s = %q, want %q", name, got.Header[name], vals)
		}
	}
}
