package storetest_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/storetest"
)

// The suite is only worth running if it fails for a store that breaks the
// contract. Each mutant below wraps the memory store to break one rule; the
// suite runs against it in a child process, which must fail in the named cases.

const mutantEnv = "STORETEST_MUTANT"

// mutant breaks one rule of the store contract over a correct store.
type mutant struct {
	store.Store
	mu       sync.Mutex
	kind     string
	tokens   map[store.ID]store.Token       // last token handed out
	fps      map[store.ID]store.Fingerprint // first fingerprint claimed
	kept     map[store.ID]*store.Record     // records as the mutant returns them
	claimRet map[store.ID]time.Duration     // retention of the last claim
}

var mutants = map[string]string{ // kind -> cases that must fail (regexp)
	"ignore-token":       "StaleHolderRefused",
	"ignore-fingerprint": "MismatchInFlight|MismatchCompleted|MismatchExpiredLease",
	"no-copy":            "CompleteCopiesResponse",
	"shared-record":      "RecordUnchangedAfterReturn",
	"never-takeover":     "TakeoverAfterLeaseExpiry|StaleHolderRefused",
	"double-claim":       "ConcurrentClaimOneWinner|InFlightDuplicate",
	"no-retention":       "RetentionExpiry|InFlightRetentionExpiry",
	"claim-retention":    "CompleteRetentionDecides",
	"renew-noop":         "RenewExtendsLease",
	"release-noop":       "ReleaseThenReclaim",
	"scope-blind":        "ScopesIsolated",
	"omitted-dropped":    "OmittedBody",
	"body-truncated":     "BodiesRoundTrip",
	"no-validation":      "InvalidArguments",
	"no-takeover-flag":   "TakeoverAfterLeaseExpiry|MismatchExpiredLease",
	"zero-retry-after":   "InFlightDuplicate|RenewExtendsLease",
	// The optional Inspector section.
	"evict-ignores-policy": "EvictCompletedRefusesInFlight|EvictLeaseExpiredRefusesCompleted",
	"evict-noop":           "EvictCompleted|EvictLeaseExpired|EvictLiveForced|EvictScopesIsolated",
	"evict-scope-blind":    "EvictScopesIsolated",
	"inspect-claims":       "InspectChangesNothing",
	"inspect-no-lease":     "InspectInFlight|InspectChangesNothing",
	"evict-no-validation":  "InspectorInvalidArguments",
}

// Inspect and Evict make every mutant a store.Inspector over the memory store's.
func (m *mutant) Inspect(ctx context.Context, id store.ID) (store.Info, error) {
	inner := m.Store.(store.Inspector)
	info, err := inner.Inspect(ctx, id)
	if err != nil {
		return info, err
	}
	switch m.kind {
	case "inspect-claims": // "looks" by claiming: takes over expired leases, creates absent keys
		_, err = m.Store.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: info.Fingerprint, Lease: time.Second, Retention: time.Minute})
	case "inspect-no-lease":
		info.LeaseUntil = time.Time{}
	}
	return info, err
}

func (m *mutant) Evict(ctx context.Context, id store.ID, p store.EvictPolicy) (store.Info, bool, error) {
	inner := m.Store.(store.Inspector)
	switch m.kind {
	case "evict-ignores-policy":
		p = store.EvictAny
	case "evict-scope-blind":
		id.Scope = ""
	case "evict-no-validation":
		if id.Key == "" {
			return store.Info{}, false, nil
		}
		p = store.EvictAny
	case "evict-noop":
		found, err := inner.Inspect(ctx, id)
		return found, p.Allows(found), err
	}
	return inner.Evict(ctx, id, p)
}

func (m *mutant) Claim(ctx context.Context, r store.ClaimRequest) (store.ClaimResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.kind {
	case "ignore-fingerprint":
		if fp, ok := m.fps[r.ID]; ok {
			r.Fingerprint = fp
		} else {
			m.fps[r.ID] = r.Fingerprint
		}
	case "no-retention":
		r.Retention *= 1000
	case "claim-retention":
		m.claimRet[r.ID] = r.Retention
	case "scope-blind":
		r.Scope = ""
	case "no-validation":
		r.Key = "k" + r.Key
		r.Lease = max(r.Lease, time.Second)
		r.Retention = max(r.Retention, r.Lease)
	}
	res, err := m.Store.Claim(ctx, r)
	if err != nil {
		return res, err
	}
	switch m.kind {
	case "never-takeover":
		if res.Takeover {
			return store.ClaimResult{Outcome: store.InFlight, RetryAfter: r.Lease}, nil
		}
	case "double-claim":
		if res.Outcome == store.InFlight {
			if _, seen := m.tokens[r.ID]; !seen {
				m.tokens[r.ID] = store.NewToken()
				return store.ClaimResult{Outcome: store.Claimed, Token: m.tokens[r.ID]}, nil
			}
		}
	case "no-takeover-flag":
		res.Takeover = false
	case "zero-retry-after":
		res.RetryAfter = 0
	case "no-copy", "shared-record":
		if res.Outcome == store.Completed {
			if kept, ok := m.kept[r.ID]; ok {
				res.Record = kept
			}
		}
	}
	if res.Outcome == store.Claimed && m.kind == "ignore-token" {
		m.tokens[r.ID] = res.Token
	}
	return res, nil
}

func (m *mutant) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.kind {
	case "ignore-token":
		tok = m.tokens[id]
	case "no-retention":
		ret *= 1000
	case "claim-retention": // the claim's retention wins over Complete's
		ret = m.claimRet[id]
	case "scope-blind":
		id.Scope = ""
	case "omitted-dropped":
		resp.BodyOmitted = false
	case "body-truncated":
		resp.Body = resp.Body[:min(len(resp.Body), 64<<10)]
	case "no-validation":
		id.Key = "k" + id.Key
		resp.Status = min(max(resp.Status, 100), 999)
	}
	if err := m.Store.Complete(ctx, id, tok, resp, ret); err != nil {
		return err
	}
	switch m.kind {
	case "no-copy": // keeps the caller's slices
		m.kept[id] = &store.Record{Response: resp}
	case "shared-record": // one record per key, overwritten in place
		if rec, ok := m.kept[id]; ok {
			rec.Response = resp
		} else {
			m.kept[id] = &store.Record{Response: resp}
		}
	}
	return nil
}

func (m *mutant) Release(ctx context.Context, id store.ID, tok store.Token) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.kind {
	case "ignore-token":
		tok = m.tokens[id]
	case "release-noop":
		return nil
	case "scope-blind":
		id.Scope = ""
	case "no-validation":
		id.Key = "k" + id.Key
	}
	return m.Store.Release(ctx, id, tok)
}

func (m *mutant) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.kind {
	case "ignore-token":
		tok = m.tokens[id]
	case "renew-noop":
		return nil
	case "scope-blind":
		id.Scope = ""
	case "no-validation":
		id.Key = "k" + id.Key
	}
	return m.Store.Renew(ctx, id, tok, lease)
}

// TestMutantSubject runs the suite against the mutant named by STORETEST_MUTANT;
// it only runs as the child process of TestSuiteCatchesMutants.
func TestMutantSubject(t *testing.T) {
	kind := os.Getenv(mutantEnv)
	if kind == "" {
		t.Skip("child process of TestSuiteCatchesMutants")
	}
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		c := testclock.New(time.Unix(1_700_000_000, 0))
		m := &mutant{Store: memory.New(memory.WithClock(c.Now)), kind: kind,
			tokens: map[store.ID]store.Token{}, fps: map[store.ID]store.Fingerprint{}, kept: map[store.ID]*store.Record{},
			claimRet: map[store.ID]time.Duration{}}
		return storetest.Subject{Store: m, Wait: c.Add}
	})
}

func TestSuiteCatchesMutants(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("in a child process")
	}
	if testing.Short() {
		t.Skip("runs the suite once per mutant in a child process")
	}
	failed := regexp.MustCompile(`--- FAIL: TestMutantSubject/(?:Inspector/)?(\w+)`)
	for kind, want := range mutants {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestMutantSubject$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+kind)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a store that breaks %q", kind)
			}
			var got []string
			for _, m := range failed.FindAllStringSubmatch(string(out), -1) {
				got = append(got, m[1])
			}
			if len(got) == 0 {
				t.Fatalf("child failed without a failing case:\n%s", out)
			}
			wantRe := regexp.MustCompile("^(" + want + ")$")
			caught := false
			for _, name := range got {
				caught = caught || wantRe.MatchString(name)
			}
			if !caught {
				t.Errorf("mutant %q failed cases %s, want one of %s", kind, strings.Join(got, ","), want)
			}
		})
	}
}
