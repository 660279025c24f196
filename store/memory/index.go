package memory

// index maps a record's hash (Store.hash) to the slot of the first record of
// its chain (entry.next links the others with the same hash). It replaces a
// map[uint64]ref: a claim of a new key, the common first execution, misses in
// a table far larger than the caches, and a map reads the miss's group and
// writes the new slot in up to three cache lines, where this table reads and
// writes one.
//
// Open addressing with linear probing over a power-of-two table of words, no
// pointers among them: a word holds the hash's upper 32 bits (its tag) above
// the ref, 0 is empty. A hash lives at or after the word its tag picks (its
// home), so the table grows and deletes (backward shift) from the words alone;
// a word whose tag matches is checked against the full hash of its record. The
// table doubles when half full.
type index struct {
	words []uint64
	n     int // words in use
}

// pos returns the position of h's word and true, or where h's word would go
// and false. Called with the shard's lock held.
func (x *index) pos(sh *shard, h uint64) (int, bool) {
	tag := h >> 32
	mask := len(x.words) - 1
	for i := int(tag) & mask; ; i = (i + 1) & mask {
		w := x.words[i]
		if w == 0 {
			return i, false
		}
		if w>>32 == tag && sh.at(ref(uint32(w))).hash == h {
			return i, true
		}
	}
}

// get returns the first record of h's chain, 0 if none.
func (x *index) get(sh *shard, h uint64) ref {
	if x.n == 0 {
		return 0
	}
	if i, ok := x.pos(sh, h); ok {
		return ref(uint32(x.words[i]))
	}
	return 0
}

// set makes r the first record of h's chain.
func (x *index) set(sh *shard, h uint64, r ref) {
	if len(x.words) == 0 {
		x.grow()
	}
	i, ok := x.pos(sh, h)
	if !ok {
		if 2*(x.n+1) > len(x.words) {
			x.grow()
			i, _ = x.pos(sh, h)
		}
		x.n++
	}
	x.words[i] = h>>32<<32 | uint64(uint32(r))
}

// del removes h's chain, shifting the words after it back so that every word
// stays reachable from its home.
func (x *index) del(sh *shard, h uint64) {
	if x.n == 0 {
		return
	}
	i, ok := x.pos(sh, h)
	if !ok {
		return
	}
	x.n--
	mask := len(x.words) - 1
	for j := (i + 1) & mask; x.words[j] != 0; j = (j + 1) & mask {
		// The word at j moves to the hole at i unless its home lies cyclically
		// in (i, j]: then it is still found from there.
		if home := int(x.words[j]>>32) & mask; (j-home)&mask >= (j-i)&mask {
			x.words[i] = x.words[j]
			i = j
		}
	}
	x.words[i] = 0
}

// grow doubles the table (8 words at first).
func (x *index) grow() {
	old := x.words
	x.words = make([]uint64, max(2*len(old), 8))
	mask := len(x.words) - 1
	for _, w := range old {
		if w == 0 {
			continue
		}
		i := int(w>>32) & mask
		for x.words[i] != 0 {
			i = (i + 1) & mask
		}
		x.words[i] = w
	}
}
