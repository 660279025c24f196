package memory

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// TestIndexMatchesMap runs random sets and deletes on an index and on a map side
// by side, with hashes drawn so that many share their tag's low bits (crowded
// homes, long runs to shift back on delete) or their whole tag, and checks every
// hash's answer, every word's reachability and the count after each step.
func TestIndexMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var sh shard
	hashes := make([]uint64, 600)
	for i := range hashes {
		tag := uint64(rng.IntN(40)) << 32 // few tags: crowded homes
		if i%3 == 0 {
			tag = uint64(rng.Uint32()) << 32
		}
		hashes[i] = tag | uint64(rng.Uint32()) // the low bits tell shared tags apart
		e := sh.alloc()
		e.hash = hashes[i]
	}
	var x index
	model := map[uint64]ref{}
	for step := range 20_000 {
		i := rng.IntN(len(hashes))
		h := hashes[i]
		switch {
		case rng.IntN(3) > 0:
			r := ref(i + 1) // the record whose hash is h
			x.set(&sh, h, r)
			model[h] = r
		default:
			x.del(&sh, h)
			delete(model, h)
		}
		if step%97 == 0 || step > 19_900 {
			for _, h := range hashes {
				if got, want := x.get(&sh, h), model[h]; got != want {
					t.Fatalf("step %d: get(%#x) = %d, want %d", step, h, got, want)
				}
			}
			if got := x.chains(t, &sh); len(got) != len(model) {
				t.Fatalf("step %d: %d chains, want %d", step, len(got), len(model))
			}
		}
	}
}

// FuzzIndexMatchesMap: each pair of bytes is an op on an index and a map:
// set or delete one of 256 hashes whose tags share few low bits (crowded homes,
// long runs), some whose whole tag is shared, and whose low words tell them
// apart.
func FuzzIndexMatchesMap(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 130, 1, 4, 5})
	f.Add(make([]byte, 512))
	f.Fuzz(func(t *testing.T, ops []byte) {
		var sh shard
		hashes := make([]uint64, 256)
		for i := range hashes {
			tag := uint64(i%7) << 32 // 7 tags: homes crowded at any table size
			if i%5 == 0 {
				tag = uint64(i) << 40 // homes apart once the table is big
			}
			hashes[i] = tag | uint64(i)*0x9e37 + 1
			sh.alloc().hash = hashes[i]
		}
		var x index
		model := map[uint64]ref{}
		for k := 0; k+1 < len(ops); k += 2 {
			i := int(ops[k+1])
			h := hashes[i]
			if ops[k]&3 != 0 {
				x.set(&sh, h, ref(i+1))
				model[h] = ref(i + 1)
			} else {
				x.del(&sh, h)
				delete(model, h)
			}
			if x.n != len(model) || 2*x.n > len(x.words) && len(x.words) > 0 {
				t.Fatalf("op %d: %d in use of %d words, model %d", k/2, x.n, len(x.words), len(model))
			}
		}
		for _, h := range hashes {
			if got, want := x.get(&sh, h), model[h]; got != want {
				t.Fatalf("get(%#x) = %d, want %d", h, got, want)
			}
		}
		x.chains(t, &sh)
	})
}

// The store's invariants (checkHeap: every index word found from its home, each
// chain's records, the expiry structures) hold under random operations when
// many hashes share their tag's low bits and some their whole tag, so the
// index's runs are long and deletions and slot moves (free, relink) shift them.
func TestStoreCrowdedIndex(t *testing.T) {
	for _, mask := range []uint64{0x0000_0003_0000_ffff, 0x0000_0000_ffff_ffff, 0xffff_0000_0000_0000 | 0xff} {
		t.Run(strconv.FormatUint(mask, 16), func(t *testing.T) {
			now := time.Unix(1_700_000_000, 0)
			s := New(WithClock(func() time.Time { return now }), WithShards(3))
			s.hashMask = mask
			rng := rand.New(rand.NewPCG(mask, 7))
			randomOps(t, s, rng, &now, 30000, func() store.ID {
				return store.ID{Key: strconv.Itoa(rng.IntN(3000)), Scope: fmt.Sprint(rng.IntN(2))}
			}, func(i int) {
				if i%500 == 0 {
					checkHeap(t, s)
				}
			})
			checkHeap(t, s)
			now = now.Add(time.Hour)
			checkSwept(t, s)
		})
	}
}
