package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// The optional section of the suite: Run runs it, under "Inspector/...", against
// stores that implement store.Inspector, and skips it for the others.
var inspectorCases = []struct {
	name string
	run  func(t *testing.T, s *suite, in store.Inspector)
}{
	{"InspectAbsent", testInspectAbsent},
	{"InspectInFlight", testInspectInFlight},
	{"InspectCompleted", testInspectCompleted},
	{"InspectChangesNothing", testInspectChangesNothing},
	{"InspectPastRetention", testInspectPastRetention},
	{"EvictCompleted", testEvictCompleted},
	{"EvictCompletedRefusesInFlight", testEvictRefusesInFlight},
	{"EvictLeaseExpired", testEvictLeaseExpired},
	{"EvictLeaseExpiredRefusesCompleted", testEvictLeaseExpiredRefusesCompleted},
	{"EvictLiveForced", testEvictLive},
	{"EvictAbsent", testEvictAbsent},
	{"EvictScopesIsolated", testEvictScopes},
	{"InspectorInvalidArguments", testInspectorInvalid},
}

func runInspector(t *testing.T, open func(t *testing.T) Subject) {
	t.Run("Inspector", func(t *testing.T) {
		if probe := open(t); probe.Store != nil {
			if _, ok := probe.Store.(store.Inspector); !ok {
				t.Skipf("%T does not implement store.Inspector", probe.Store)
			}
		}
		for _, tc := range inspectorCases {
			t.Run(tc.name, func(t *testing.T) {
				s := open(t)
				if s.Store == nil {
					t.Fatal("storetest: open returned a nil Store")
				}
				in, ok := s.Store.(store.Inspector)
				if !ok {
					t.Fatalf("storetest: open returned a %T, not a store.Inspector, this time", s.Store)
				}
				if s.Wait == nil {
					s.Wait = time.Sleep
				}
				tc.run(t, &suite{Subject: s, ctx: t.Context()}, in)
			})
		}
	})
}

func (s *suite) inspect(t *testing.T, in store.Inspector, id store.ID, want store.State) store.Info {
	t.Helper()
	info, err := in.Inspect(s.ctx, id)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if info.State != want {
		t.Fatalf("Inspect: state %v, want %v", info.State, want)
	}
	if info.Now.IsZero() {
		t.Error("Inspect: Now not set")
	}
	return info
}

func (s *suite) evict(t *testing.T, in store.Inspector, id store.ID, p store.EvictPolicy, wantState store.State, wantEvicted bool) store.Info {
	t.Helper()
	found, evicted, err := in.Evict(s.ctx, id, p)
	if err != nil {
		t.Fatalf("Evict(%v): %v", p, err)
	}
	if found.State != wantState || evicted != wantEvicted {
		t.Fatalf("Evict(%v): found %v, evicted %v; want %v, %v", p, found.State, evicted, wantState, wantEvicted)
	}
	return found
}

// near reports whether got is within tolerance of want.
func near(got, want, tolerance time.Duration) bool {
	return got >= want-tolerance && got <= want+tolerance
}

func testInspectAbsent(t *testing.T, s *suite, in store.Inspector) {
	info := s.inspect(t, in, newID(t), store.StateAbsent)
	if info != (store.Info{Now: info.Now}) {
		t.Errorf("absent record described as %+v", info)
	}
}

func testInspectInFlight(t *testing.T, s *suite, in store.Inspector) {
	id := newID(t)
	s.mustClaim(t, longReq(id, fpA))
	info := s.inspect(t, in, id, store.StateInFlight)
	if info.Fingerprint != fpA {
		t.Errorf("fingerprint %v, want %v", info.Fingerprint, fpA)
	}
	if !info.LeaseLive() {
		t.Errorf("lease of a fresh claim not live: until %v, now %v", info.LeaseUntil, info.Now)
	}
	if r := info.LeaseRemaining(); r <= 0 || r > 5*time.Second {
		t.Errorf("LeaseRemaining %v, want within (0, 5s]", r)
	}
	if d := info.ExpiresAt.Sub(info.CreatedAt); !near(d, Retention, time.Second) {
		t.Errorf("in-flight retention %v, want about %v", d, Retention)
	}
	if d := info.LeaseUntil.Sub(info.CreatedAt); !near(d, 5*time.Second, time.Second) {
		t.Errorf("lease %v after creation, want about 5s", d)
	}
	if !info.CompletedAt.IsZero() || info.Status != 0 || info.BodyBytes != 0 {
		t.Errorf("in-flight record with completion fields: %+v", info)
	}
}

func testInspectCompleted(t *testing.T, s *suite, in store.Inspector) {
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	resp := sampleResponse()
	s.complete(t, id, tok, resp)
	info := s.inspect(t, in, id, store.StateCompleted)
	switch {
	case info.Fingerprint != fpA:
		t.Errorf("fingerprint %v, want %v", info.Fingerprint, fpA)
	case info.Status != resp.Status:
		t.Errorf("status %d, want %d", info.Status, resp.Status)
	case info.BodyBytes != len(resp.Body) || info.BodyOmitted:
		t.Errorf("body %d bytes (omitted %v), want %d", info.BodyBytes, info.BodyOmitted, len(resp.Body))
	case !info.LeaseUntil.IsZero() || info.LeaseLive():
		t.Errorf("completed record with a lease: %v", info.LeaseUntil)
	case info.CreatedAt.IsZero() || info.CompletedAt.Before(info.CreatedAt):
		t.Errorf("created %v, completed %v", info.CreatedAt, info.CompletedAt)
	case !near(info.ExpiresAt.Sub(info.CompletedAt), Retention, time.Second):
		t.Errorf("retention %v, want about %v", info.ExpiresAt.Sub(info.CompletedAt), Retention)
	case info.Now.Before(info.CompletedAt.Add(-slack)) || !info.Now.Before(info.ExpiresAt):
		t.Errorf("store clock %v outside [%v, %v)", info.Now, info.CompletedAt, info.ExpiresAt)
	}
	// The stored record agrees with what a replay carries.
	rec := s.expect(t, req(id, fpA), store.Completed).Record
	// (A cache in front of the store may keep its own clock's times: a second apart at most.)
	if !near(rec.CreatedAt.Sub(info.CreatedAt), 0, time.Second) || !near(rec.CompletedAt.Sub(info.CompletedAt), 0, time.Second) ||
		!near(rec.ExpiresAt.Sub(info.ExpiresAt), 0, time.Second) {
		t.Errorf("Inspect times %v/%v/%v, replay's %v/%v/%v", info.CreatedAt, info.CompletedAt, info.ExpiresAt,
			rec.CreatedAt, rec.CompletedAt, rec.ExpiresAt)
	}

	omitted := newID(t)
	tok = s.mustClaim(t, req(omitted, fpB))
	s.complete(t, omitted, tok, store.Response{Status: 200, BodyOmitted: true})
	if info := s.inspect(t, in, omitted, store.StateCompleted); !info.BodyOmitted || info.BodyBytes != 0 || info.Fingerprint != fpB {
		t.Errorf("omitted body described as %+v", info)
	}
}

func testInspectChangesNothing(t *testing.T, s *suite, in store.Inspector) {
	// In flight: inspecting neither takes the claim over nor moves its lease.
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	first := s.inspect(t, in, id, store.StateInFlight)
	s.Wait(Lease + slack)
	after := s.inspect(t, in, id, store.StateInFlight)
	if after.LeaseLive() {
		t.Error("lease still live after it ran out")
	}
	// A store that keeps the expiry as a TTL (Redis) reports it at millisecond
	// precision from a clock read in the same call, so two reads may differ by 1 ms.
	if d := after.ExpiresAt.Sub(first.ExpiresAt); !after.LeaseUntil.Equal(first.LeaseUntil) ||
		d < -time.Millisecond || d > time.Millisecond || !after.CreatedAt.Equal(first.CreatedAt) {
		t.Errorf("Inspect moved the record: %+v then %+v", first, after)
	}
	// The expired lease still belongs to its holder, who completes.
	want := sampleResponse()
	s.complete(t, id, tok, want)
	for range 2 {
		s.inspect(t, in, id, store.StateCompleted)
	}
	equalResponse(t, s.expect(t, req(id, fpA), store.Completed).Record, want)

	// Absent: inspecting creates nothing.
	absent := newID(t)
	s.inspect(t, in, absent, store.StateAbsent)
	if err := s.Store.Release(s.ctx, absent, store.NewToken()); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Release after inspecting an absent key: %v, want ErrLeaseLost", err)
	}
	if res := s.expect(t, req(absent, fpB), store.Claimed); res.Takeover {
		t.Error("claim after inspecting an absent key is a takeover")
	}
}

func testInspectPastRetention(t *testing.T, s *suite, in store.Inspector) {
	id := newID(t)
	short := 3 * Lease
	r := store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: Lease, Retention: short}
	tok := s.mustClaim(t, r)
	if err := s.Store.Complete(s.ctx, id, tok, sampleResponse(), short); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	abandoned := newID(t)
	s.mustClaim(t, store.ClaimRequest{ID: abandoned, Fingerprint: fpA, Lease: Lease, Retention: short})
	s.Wait(short + slack)
	s.inspect(t, in, id, store.StateAbsent)
	s.inspect(t, in, abandoned, store.StateAbsent)
	s.evict(t, in, id, store.EvictAny, store.StateAbsent, false)
}

// isNew checks that id is a new key: a claim for another fingerprint wins, and
// is no takeover.
func (s *suite) isNew(t *testing.T, id store.ID) store.Token {
	t.Helper()
	res := s.expect(t, longReq(id, fpB), store.Claimed)
	if res.Takeover {
		t.Error("claim after eviction is a takeover")
	}
	return res.Token
}

func testEvictCompleted(t *testing.T, s *suite, in store.Inspector) {
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	s.complete(t, id, tok, sampleResponse())
	found := s.evict(t, in, id, store.EvictCompleted, store.StateCompleted, true)
	if found.Status != 201 || found.Fingerprint != fpA {
		t.Errorf("Evict found %+v, want the completed record", found)
	}
	s.inspect(t, in, id, store.StateAbsent)
	s.evict(t, in, id, store.EvictAny, store.StateAbsent, false)
	s.isNew(t, id)
}

func testEvictRefusesInFlight(t *testing.T, s *suite, in store.Inspector) {
	id := newID(t)
	tok := s.mustClaim(t, longReq(id, fpA))
	for _, p := range []store.EvictPolicy{store.EvictCompleted, store.EvictLeaseExpired, store.EvictSettled} {
		found := s.evict(t, in, id, p, store.StateInFlight, false)
		if !found.LeaseLive() || found.Fingerprint != fpA {
			t.Errorf("Evict(%v) found %+v, want a live lease of fpA", p, found)
		}
	}
	// Refused means untouched: the holder is still in flight and completes.
	s.expect(t, req(id, fpA), store.InFlight)
	want := sampleResponse()
	s.complete(t, id, tok, want)
	equalResponse(t, s.expect(t, req(id, fpA), store.Completed).Record, want)
}

func testEvictLeaseExpired(t *testing.T, s *suite, in store.Inspector) {
	id := newID(t)
	stale := s.mustClaim(t, req(id, fpA))
	s.Wait(Lease + slack)
	found := s.evict(t, in, id, store.EvictLeaseExpired, store.StateInFlight, true)
	if found.LeaseLive() {
		t.Errorf("evicted a lease reported live: %+v", found)
	}
	if err := s.Store.Complete(s.ctx, id, stale, sampleResponse(), Retention); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Complete by the evicted holder: %v, want ErrLeaseLost", err)
	}
	s.isNew(t, id)
}

func testEvictLeaseExpiredRefusesCompleted(t *testing.T, s *suite, in store.Inspector) {
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	want := sampleResponse()
	s.complete(t, id, tok, want)
	s.evict(t, in, id, store.EvictLeaseExpired|store.EvictLive, store.StateCompleted, false)
	equalResponse(t, s.expect(t, req(id, fpA), store.Completed).Record, want)
}

func testEvictLive(t *testing.T, s *suite, in store.Inspector) {
	id := newID(t)
	tok := s.mustClaim(t, longReq(id, fpA))
	found := s.evict(t, in, id, store.EvictLive, store.StateInFlight, true)
	if !found.LeaseLive() {
		t.Errorf("forced eviction found %+v, want a live lease", found)
	}
	if err := s.Store.Renew(s.ctx, id, tok, Lease); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Renew by the evicted holder: %v, want ErrLeaseLost", err)
	}
	if err := s.Store.Complete(s.ctx, id, tok, sampleResponse(), Retention); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Complete by the evicted holder: %v, want ErrLeaseLost", err)
	}
	fresh := s.isNew(t, id)
	// The new holder is not disturbed by the evicted one.
	if err := s.Store.Release(s.ctx, id, tok); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Release by the evicted holder: %v, want ErrLeaseLost", err)
	}
	s.complete(t, id, fresh, store.Response{Status: 200})
	s.expect(t, longReq(id, fpB), store.Completed)
}

func testEvictAbsent(t *testing.T, s *suite, in store.Inspector) {
	id := newID(t)
	found := s.evict(t, in, id, store.EvictAny, store.StateAbsent, false)
	if found != (store.Info{Now: found.Now}) {
		t.Errorf("absent record described as %+v", found)
	}
	s.isNew(t, id)
}

func testEvictScopes(t *testing.T, s *suite, in store.Inspector) {
	key := "shared-" + store.NewToken().String()
	alice, bob := store.ID{Scope: "alice", Key: key}, store.ID{Scope: "bob", Key: key}
	for _, id := range []store.ID{alice, bob} {
		tok := s.mustClaim(t, req(id, fpA))
		s.complete(t, id, tok, sampleResponse())
	}
	s.evict(t, in, alice, store.EvictCompleted, store.StateCompleted, true)
	s.inspect(t, in, alice, store.StateAbsent)
	s.inspect(t, in, bob, store.StateCompleted)
	s.expect(t, req(bob, fpA), store.Completed)
}

func testInspectorInvalid(t *testing.T, s *suite, in store.Inspector) {
	id := newID(t)
	for _, bad := range []store.ID{{Scope: "s"}, {Key: strings.Repeat("k", store.MaxKeyLen+1)}, {Scope: strings.Repeat("s", store.MaxScopeLen+1), Key: "k"}} {
		if _, err := in.Inspect(s.ctx, bad); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Inspect(%d-byte scope, %d-byte key): %v, want ErrInvalid", len(bad.Scope), len(bad.Key), err)
		}
	}
	tok := s.mustClaim(t, req(id, fpA))
	s.complete(t, id, tok, sampleResponse())
	for _, tc := range []struct {
		id store.ID
		p  store.EvictPolicy
	}{
		{store.ID{Scope: id.Scope}, store.EvictAny},
		{store.ID{Scope: id.Scope, Key: strings.Repeat("k", store.MaxKeyLen+1)}, store.EvictAny},
		{store.ID{Scope: strings.Repeat("s", store.MaxScopeLen+1), Key: id.Key}, store.EvictAny},
		{id, 0},
		{id, store.EvictAny + 1},
	} {
		if _, evicted, err := in.Evict(s.ctx, tc.id, tc.p); !errors.Is(err, store.ErrInvalid) || evicted {
			t.Errorf("Evict(%d-byte scope, %d-byte key, %v): evicted %v, %v; want ErrInvalid", len(tc.id.Scope), len(tc.id.Key), tc.p, evicted, err)
		}
	}
	// The refused calls removed nothing.
	s.expect(t, req(id, fpA), store.Completed)
}
