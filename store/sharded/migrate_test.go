package sharded_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/sharded"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestMigrationConformance runs the whole suite on a migration that reorders
// three memory shards.
func TestMigrationConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		a, b, c := memory.New(), memory.New(), memory.New()
		s, err := sharded.NewMigration(sharded.ByHash(a, b, c), sharded.ByHash(c, a, b), a, b, c)
		if err != nil {
			t.Fatal(err)
		}
		return storetest.Subject{Store: s}
	})
}

const migrationScopes = 3000

// placementChange is one change of the shard list, from three shards.
type placementChange struct {
	name string
	next func(a, b, c, d store.Store) func(string) store.Store
}

var placementChanges = []placementChange{
	{"remove the first of three", func(a, b, c, d store.Store) func(string) store.Store { return sharded.ByHash(b, c) }},
	{"remove the last of three", func(a, b, c, d store.Store) func(string) store.Store { return sharded.ByHash(a, b) }},
	{"reorder", func(a, b, c, d store.Store) func(string) store.Store { return sharded.ByHash(c, a, b) }},
	{"reverse", func(a, b, c, d store.Store) func(string) store.Store { return sharded.ByHash(c, b, a) }},
	{"add a fourth", func(a, b, c, d store.Store) func(string) store.Store { return sharded.ByHash(a, b, c, d) }},
}

// rerunFraction completes one key per scope under ByHash(a, b, c), then sends
// each key again through the store newStore builds over the changed list, and
// returns the fraction of keys run again (claimed), of keys in flight not
// answered 409, and checks where new keys land.
func rerunFraction(t *testing.T, ch placementChange, migrate bool) (rerun float64) {
	t.Helper()
	ctx := context.Background()
	a, b, c, d := memory.New(), memory.New(), memory.New(), memory.New()
	prev := sharded.ByHash(a, b, c)
	before, err := sharded.New(prev, a, b, c)
	if err != nil {
		t.Fatal(err)
	}
	req := func(i int, key string) store.ClaimRequest {
		return store.ClaimRequest{ID: store.ID{Scope: fmt.Sprintf("tenant-%d", i), Key: key},
			Fingerprint: store.Fingerprint{byte(i)}, Lease: time.Minute, Retention: time.Hour}
	}
	for i := range migrationScopes {
		res, err := before.Claim(ctx, req(i, "done"))
		if err != nil || res.Outcome != store.Claimed {
			t.Fatal(res, err)
		}
		if err := before.Complete(ctx, req(i, "done").ID, res.Token, store.Response{Status: 201}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, err := before.Claim(ctx, req(i, "running")); err != nil {
			t.Fatal(err)
		}
	}
	next := ch.next(a, b, c, d)
	var after *sharded.Store
	if migrate {
		after, err = sharded.NewMigration(prev, next, a, b, c, d)
	} else {
		after, err = sharded.New(next, a, b, c, d)
	}
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	for i := range migrationScopes {
		res, err := after.Claim(ctx, req(i, "done"))
		if err != nil {
			t.Fatal(err)
		}
		switch res.Outcome {
		case store.Claimed:
			runs++
		case store.Completed:
		default:
			t.Fatalf("a completed key: %v", res.Outcome)
		}
		if !migrate {
			continue
		}
		if res, err := after.Claim(ctx, req(i, "running")); err != nil || res.Outcome != store.InFlight {
			t.Fatalf("a key in flight: %v %v, want InFlight", res.Outcome, err)
		}
		// A new key lands on the next placement.
		id := req(i, "new").ID
		if res, err := after.Claim(ctx, req(i, "new")); err != nil || res.Outcome != store.Claimed {
			t.Fatal(res, err)
		}
		if info, err := next(id.Scope).(store.Inspector).Inspect(ctx, id); err != nil || info.State != store.StateInFlight {
			t.Fatalf("a new key is not on its next shard: %v %v", info.State, err)
		}
	}
	return float64(runs) / migrationScopes
}

// TestMigrationRerunsNothing: changing the shard list (removing the first of
// three, the last, reordering, reversing, adding one) re-runs completed keys
// with New over the new list, and none with NewMigration, which also keeps a
// key in flight in flight and puts new keys on the new placement. The
// fractions are those of docs/scaling.md.
func TestMigrationRerunsNothing(t *testing.T) {
	for _, ch := range placementChanges {
		plain := rerunFraction(t, ch, false)
		migrated := rerunFraction(t, ch, true)
		t.Logf("%-26s New: %5.1f%% of completed keys run again; NewMigration: %.1f%%", ch.name, 100*plain, 100*migrated)
		if migrated != 0 {
			t.Errorf("%s: %.1f%% re-run under NewMigration", ch.name, 100*migrated)
		}
		if plain == 0 {
			t.Errorf("%s: New re-ran nothing; the measure is broken", ch.name)
		}
	}
}

// A claim taken over on the previous shard (its lease expired) is completed
// there: Complete, Renew and Release reach the shard that holds the token.
func TestMigrationHolderOnPreviousShard(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	a, b := memory.New(memory.WithClock(clock)), memory.New(memory.WithClock(clock))
	id := store.ID{Scope: "t", Key: "k"}
	req := store.ClaimRequest{ID: id, Lease: time.Second, Retention: time.Hour}
	if _, err := a.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Second) // the first holder's lease expired
	s, err := sharded.NewMigration(func(string) store.Store { return a }, func(string) store.Store { return b }, a, b)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Claim(ctx, req)
	if err != nil || res.Outcome != store.Claimed || !res.Takeover {
		t.Fatalf("takeover: %+v %v", res, err)
	}
	if err := s.Renew(ctx, id, res.Token, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, id, res.Token, store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if info, _ := a.Inspect(ctx, id); info.State != store.StateCompleted {
		t.Fatalf("previous shard: %v", info.State)
	}
	if info, _ := b.Inspect(ctx, id); info.State != store.StateAbsent {
		t.Fatalf("next shard: %v", info.State)
	}
	if _, err := sharded.NewMigration(nil, func(string) store.Store { return b }, b); err == nil {
		t.Fatal("nil previous route accepted")
	}
}
