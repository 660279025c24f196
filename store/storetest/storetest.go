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
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
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
	s.complete(t, id, tok, want)
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
		if d := r.ExpiresAt.Sub(r.CompletedAt); d < Retention-time.Second || d > Retention+time.Second {
			t.Errorf("retention kept %v, want about %v", d, Retention)
		}
	}
}

func testInFlightDuplicate(t *testing.T, s *suite) {
	id := newID(t)
	s.mustClaim(t, req(id, fpA))
	res := s.expect(t, req(id, fpA), store.InFlight)
	if res.RetryAfter <= 0 || res.RetryAfter > Lease {
		t.Errorf("RetryAfter %v, want within (0, %v]", res.RetryAfter, Lease)
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

func testScopesIsolated(t *testing.T, s *suite) {
	key := "shared-" + store.NewToken().String()
	alice := store.ID{Scope: "alice", Key: key}
	bob := store.ID{Scope: "bob", Key: key}
	// Scopes that would collide if joined naively.
	tricky := []store.ID{{Scope: "a", Key: "b:" + key}, {Scope: "a:b", Key: key}, {Scope: "", Key: "a:b:" + key}}

	tokA := s.mustClaim(t, req(alice, fpA))
	s.mustClaim(t, req(bob, fpB)) // another principal, another payload: no mismatch
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

func testConcurrentClaim(t *testing.T, s *suite) {
	id := newID(t)
	const n = 64
	r := req(id, fpA)
	r.Lease = 10 * time.Second // nobody may take over during the storm
	r.Retention = 20 * time.Second
	if counts := s.claimStorm(t, r, n); counts[store.Claimed] != 1 || counts[store.InFlight] != n-1 {
		t.Fatalf("outcomes %v, want exactly 1 claimed and %d in flight", counts, n-1)
	}
}

// claimStorm sends n identical claims at once and counts the outcomes.
func (s *suite) claimStorm(t *testing.T, r store.ClaimRequest, n int) map[store.Outcome]int {
	t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		counts  = map[store.Outcome]int{}
		errs    []error
		barrier = make(chan struct{})
	)
	for range n {
		wg.Go(func() {
			<-barrier
			res, err := s.Store.Claim(s.ctx, r)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			counts[res.Outcome]++
		})
	}
	close(barrier)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d claims failed, first: %v", len(errs), errs[0])
	}
	return counts
}

func testConcurrentTakeover(t *testing.T, s *suite) {
	// The takeover of an expired lease is as exclusive as a first claim.
	id := newID(t)
	s.mustClaim(t, req(id, fpA))
	s.Wait(Lease + slack)
	r := req(id, fpA)
	r.Lease = 10 * time.Second
	r.Retention = 20 * time.Second
	const n = 64
	if counts := s.claimStorm(t, r, n); counts[store.Claimed] != 1 || counts[store.InFlight] != n-1 {
		t.Fatalf("outcomes %v, want exactly 1 claimed and %d in flight", counts, n-1)
	}
}

func testCompleteCopies(t *testing.T, s *suite) {
	// The middleware reuses its buffers once Complete returns (store.Store).
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	resp := sampleResponse()
	want := store.Response{Status: resp.Status, Header: resp.Header.Clone(), Body: bytes.Clone(resp.Body)}
	s.complete(t, id, tok, resp)
	for i := range resp.Body {
		resp.Body[i] = 'X'
	}
	resp.Header["Content-Type"][0] = "text/x-scribbled"
	resp.Header.Set("X-Added", "later")
	res := s.expect(t, req(id, fpA), store.Completed)
	equalResponse(t, res.Record, want)
}

func testRecordUnchanged(t *testing.T, s *suite) {
	// A record handed out is never changed by the store, even when its key expires
	// and is completed again.
	id := newID(t)
	short := 3 * Lease
	r := store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: Lease, Retention: short}
	tok := s.mustClaim(t, r)
	first := store.Response{Status: 201, Header: http.Header{"X-Run": {"1"}}, Body: []byte("first")}
	if err := s.Store.Complete(s.ctx, id, tok, first, short); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	old := s.expect(t, r, store.Completed).Record
	s.Wait(short + slack)
	tok = s.mustClaim(t, r)
	if err := s.Store.Complete(s.ctx, id, tok, store.Response{Status: 202, Header: http.Header{"X-Run": {"2"}}, Body: []byte("again")}, short); err != nil {
		t.Fatalf("second Complete: %v", err)
	}
	equalResponse(t, old, first)
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

func testBodiesRoundTrip(t *testing.T, s *suite) {
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	large := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	large[len(large)-1] = 0
	for _, tc := range []struct {
		name string
		body []byte
	}{{"nil", nil}, {"empty", []byte{}}, {"binary", binary}, {"1MiB", large}} {
		t.Run(tc.name, func(t *testing.T) {
			id := newID(t)
			tok := s.mustClaim(t, req(id, fpA))
			resp := store.Response{Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: tc.body}
			s.complete(t, id, tok, resp)
			res := s.expect(t, req(id, fpA), store.Completed)
			if s.MaxBody > 0 && len(tc.body) > s.MaxBody {
				if len(res.Record.Body) != 0 || !res.Record.BodyOmitted {
					t.Fatalf("body of %d bytes over the store's %d: came back as %d bytes, omitted %v; want omitted",
						len(tc.body), s.MaxBody, len(res.Record.Body), res.Record.BodyOmitted)
				}
				return
			}
			if !bytes.Equal(res.Record.Body, tc.body) {
				t.Fatalf("body of %d bytes came back as %d bytes (or changed)", len(tc.body), len(res.Record.Body))
			}
			if res.Record.BodyOmitted {
				t.Error("BodyOmitted set")
			}
		})
	}
}

func testOmittedBody(t *testing.T, s *suite) {
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	want := store.Response{Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, BodyOmitted: true}
	s.complete(t, id, tok, want)
	res := s.expect(t, req(id, fpA), store.Completed)
	equalResponse(t, res.Record, want)
}

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
