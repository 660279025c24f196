package sharded_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/sharded"
)

// Store types whose values are not comparable: structs holding a slice, a
// map, a slice of stores or a func, each a working store.
type (
	sliceStruct struct {
		*memory.Store
		tags []string
	}
	mapStore   map[int]*memory.Store
	sliceStore []*memory.Store
	funcStore  func() *memory.Store
)

// Every route answer of a type that is not comparable is ErrNoShard, for every
// call (it was taken as a shard without the membership check), and New refuses
// such a shard.
func TestRouteNotComparable(t *testing.T) {
	ctx := t.Context()
	listed := memory.New()
	stray := memory.New()
	answers := map[string]store.Store{
		"struct with a slice":           sliceStruct{Store: stray, tags: []string{"x"}},
		"struct with a map":             mapStoreShard{Store: stray, m: mapStore{0: stray}},
		"struct with a slice of stores": sliceShard{Store: stray, s: sliceStore{stray}},
		"struct with a func":            funcShard{Store: stray, f: func() *memory.Store { return stray }},
	}
	for name, answer := range answers {
		s, err := sharded.New(func(string) store.Store { return answer }, listed)
		if err != nil {
			t.Fatal(err)
		}
		req := store.ClaimRequest{ID: store.ID{Scope: "a", Key: "k"}, Lease: time.Second, Retention: time.Second}
		if _, err := s.Claim(ctx, req); !errors.Is(err, sharded.ErrNoShard) {
			t.Errorf("%s: Claim = %v, want ErrNoShard", name, err)
		}
		tok := store.NewToken()
		for op, err := range map[string]error{
			"Complete": s.Complete(ctx, req.ID, tok, store.Response{Status: 200}, time.Second),
			"Release":  s.Release(ctx, req.ID, tok),
			"Renew":    s.Renew(ctx, req.ID, tok, time.Second),
			"Wait":     s.Wait(ctx, req.ID),
		} {
			if !errors.Is(err, sharded.ErrNoShard) {
				t.Errorf("%s: %s = %v, want ErrNoShard", name, op, err)
			}
		}
		if _, err := s.Shard("a"); !errors.Is(err, sharded.ErrNoShard) {
			t.Errorf("%s: Shard = %v", name, err)
		}
		if _, err := sharded.New(func(string) store.Store { return answer }, listed, answer); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: New with it as a shard = %v, want ErrInvalid", name, err)
		}
	}
	if info, _ := stray.Inspect(ctx, store.ID{Scope: "a", Key: "k"}); info.State != store.StateAbsent {
		t.Fatalf("a store outside the list got the claim: %v", info.State)
	}
}

// Wrappers that give each non-comparable kind a store's methods.
type (
	mapStoreShard struct {
		*memory.Store
		m mapStore
	}
	sliceShard struct {
		*memory.Store
		s sliceStore
	}
	funcShard struct {
		*memory.Store
		f funcStore
	}
)
