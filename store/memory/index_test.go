package memory

import (
	"math/rand/v2"
	"testing"
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
