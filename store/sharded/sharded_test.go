package sharded_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/sharded"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestConformance runs the whole suite over three memory shards routed by hash.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		s, err := sharded.NewHashed(memory.New(), memory.New(), memory.New())
		if err != nil {
			t.Fatal(err)
		}
		return storetest.Subject{Store: s}
	})
}

// probe is a shard that records the scopes of the calls it receives.
type probe struct {
	*memory.Store
	mu     sync.Mutex
	scopes map[string]int
}

func newProbe() *probe { return &probe{Store: memory.New(), scopes: map[string]int{}} }

func (p *probe) saw(scope string) {
	p.mu.Lock()
	p.scopes[scope]++
	p.mu.Unlock()
}

func (p *probe) Claim(ctx context.Context, r store.ClaimRequest) (store.ClaimResult, error) {
	p.saw(r.Scope)
	return p.Store.Claim(ctx, r)
}

func (p *probe) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	p.saw(id.Scope)
	return p.Store.Complete(ctx, id, tok, resp, ret)
}

func (p *probe) Release(ctx context.Context, id store.ID, tok store.Token) error {
	p.saw(id.Scope)
	return p.Store.Release(ctx, id, tok)
}

func (p *probe) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	p.saw(id.Scope)
	return p.Store.Renew(ctx, id, tok, lease)
}

func (p *probe) Wait(ctx context.Context, id store.ID) error {
	p.saw(id.Scope)
	return p.Store.Wait(ctx, id)
}

func (p *probe) Inspect(ctx context.Context, id store.ID) (store.Info, error) {
	p.saw(id.Scope)
	return p.Store.Inspect(ctx, id)
}

func (p *probe) Evict(ctx context.Context, id store.ID, policy store.EvictPolicy) (store.Info, bool, error) {
	p.saw(id.Scope)
	return p.Store.Evict(ctx, id, policy)
}

// TestTenantStaysOnItsShard: every call for a tenant (claim, renew, inspect,
// complete, wait, replay, evict, release) reaches the shard the route names and no
// other, with many tenants over three shards.
func TestTenantStaysOnItsShard(t *testing.T) {
	probes := []*probe{newProbe(), newProbe(), newProbe()}
	route := func(scope string) store.Store { return probes[sharded.Bucket(scope, 3)] }
	s, err := sharded.New(route, probes[0], probes[1], probes[2])
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var fp store.Fingerprint
	for i := range 60 {
		scope := fmt.Sprintf("tenant-%d", i)
		id := store.ID{Scope: scope, Key: "k"}
		req := store.ClaimRequest{ID: id, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour}
		r, err := s.Claim(ctx, req)
		if err != nil || r.Outcome != store.Claimed {
			t.Fatalf("claim: %+v %v", r, err)
		}
		if err := s.Renew(ctx, id, r.Token, time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Inspect(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, id, r.Token, store.Response{Status: 201}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(ctx, id); err != nil {
			t.Fatal(err)
		}
		if r, err := s.Claim(ctx, req); err != nil || r.Outcome != store.Completed {
			t.Fatalf("replay: %+v %v", r, err)
		}
		if _, ok, err := s.Evict(ctx, id, store.EvictCompleted); err != nil || !ok {
			t.Fatalf("evict: %v %v", ok, err)
		}
		other := store.ID{Scope: scope, Key: "released"}
		r, _ = s.Claim(ctx, store.ClaimRequest{ID: other, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour})
		if err := s.Release(ctx, other, r.Token); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range probes {
		if len(p.scopes) == 0 {
			t.Errorf("shard %d received no tenant: the hash does not spread 60 tenants over 3 shards", i)
		}
		for scope, n := range p.scopes {
			if want := sharded.Bucket(scope, 3); want != i {
				t.Errorf("%s (shard %d) reached shard %d (%d calls)", scope, want, i, n)
			}
			if n != 9 {
				t.Errorf("%s: %d calls on its shard, want all 9", scope, n)
			}
		}
	}
}

// TestBucketStable pins ByHash's placement (a change would move every tenant's
// records) and checks that a fourth shard takes scopes only from the others,
// about a quarter of them.
func TestBucketStable(t *testing.T) {
	for scope, want := range map[string]int{"": 1, "tenant-1": 1, "acme": 0, "globex": 1, "initech": 2} {
		if got := sharded.Bucket(scope, 3); got != want {
			t.Errorf("Bucket(%q, 3) = %d, want %d", scope, got, want)
		}
	}
	moved := 0
	const n = 10000
	for i := range n {
		scope := fmt.Sprintf("tenant-%d", i)
		a, b := sharded.Bucket(scope, 3), sharded.Bucket(scope, 4)
		if a != b {
			moved++
			if b != 3 {
				t.Fatalf("%s moved from shard %d to %d, not to the new shard", scope, a, b)
			}
		}
	}
	if moved < n/5 || moved > n*3/10 {
		t.Errorf("%d of %d scopes moved to the fourth shard, want about a quarter", moved, n)
	}
	if sharded.Bucket("x", 0) != 0 {
		t.Error("Bucket with no shard is not 0")
	}
}

// plain is a shard with only the four methods of store.Store.
type plain struct{ store.Store }

// TestCapabilities: a shard without Wait or Inspect answers ErrUnsupported
// through the sharded store; a route that gives no store is ErrNoShard; bad
// arguments are ErrInvalid before the route runs; New refuses misconfiguration.
func TestCapabilities(t *testing.T) {
	ctx := t.Context()
	routed := 0
	s, err := sharded.New(func(scope string) store.Store {
		routed++
		if scope == "lost" {
			return nil
		}
		return plain{memory.New()}
	}, plain{memory.New()})
	if err != nil {
		t.Fatal(err)
	}
	id := store.ID{Scope: "t", Key: "k"}
	if err := s.Wait(ctx, id); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Wait on a shard without it = %v, want ErrUnsupported", err)
	}
	if _, err := s.Inspect(ctx, id); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Inspect on a shard without it = %v, want ErrUnsupported", err)
	}
	if _, err := s.Claim(ctx, store.ClaimRequest{ID: store.ID{Scope: "lost", Key: "k"}, Lease: time.Second, Retention: time.Second}); !errors.Is(err, sharded.ErrNoShard) {
		t.Errorf("Claim without a shard = %v, want ErrNoShard", err)
	}
	routed = 0
	if err := s.Complete(ctx, store.ID{Scope: "t"}, store.NewToken(), store.Response{Status: 200}, time.Second); !errors.Is(err, store.ErrInvalid) || routed != 0 {
		t.Errorf("Complete with an empty key = %v after %d routes, want ErrInvalid before routing", err, routed)
	}
	if s.InProcess() {
		t.Error("InProcess of a shard that does not say so")
	}
	if m, _ := sharded.NewHashed(memory.New(), memory.New()); !m.InProcess() {
		t.Error("memory shards are not InProcess")
	}
	for name, f := range map[string]func() (*sharded.Store, error){
		"nil route": func() (*sharded.Store, error) { return sharded.New(nil, memory.New()) },
		"no shard":  func() (*sharded.Store, error) { return sharded.NewHashed() },
		"nil shard": func() (*sharded.Store, error) { return sharded.NewHashed(memory.New(), nil) },
	} {
		if _, err := f(); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// pinger is a shard whose Ping answers err.
type pinger struct {
	store.Store
	err error
}

func (p pinger) Ping(context.Context) error { return p.err }

// TestPing: all up is nil, some down is degraded (naming them), all down is an
// error that is not degraded.
func TestPing(t *testing.T) {
	down := errors.New("connection refused")
	up, bad := pinger{memory.New(), nil}, pinger{memory.New(), down}
	for _, tc := range []struct {
		name          string
		shards        []store.Store
		wantErr       bool
		wantDegraded  bool
		wantInMessage string
	}{
		{"all up", []store.Store{up, up}, false, false, ""},
		{"one down", []store.Store{up, bad, up}, true, true, "shards down [1]"},
		{"one degraded", []store.Store{up, pinger{memory.New(), fmt.Errorf("%w: cache", store.ErrDegraded)}}, true, true, "degraded [1]"},
		{"all down", []store.Store{bad, bad}, true, false, "every shard is down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := sharded.NewHashed(tc.shards...)
			if err != nil {
				t.Fatal(err)
			}
			err = s.Ping(t.Context())
			if (err != nil) != tc.wantErr || errors.Is(err, store.ErrDegraded) != tc.wantDegraded {
				t.Fatalf("Ping = %v; want error %v, degraded %v", err, tc.wantErr, tc.wantDegraded)
			}
			if err != nil && !strings.Contains(err.Error(), tc.wantInMessage) {
				t.Errorf("Ping = %v, want it to say %q", err, tc.wantInMessage)
			}
		})
	}
}
