package memory

import "github.com/idemkey/idemkey/store"

// A shard keeps its records in blocks of blockLen entries, densely: slots
// 1..n hold its n records. Everything else refers to a record by its slot (a
// ref), never by a pointer: the records index, the hash chains, the expiry queue
// and heap hold no pointers, and a record is no heap object of its own. The
// garbage collector then marks a block as one object and does not scan the index
// or the queue at all; with a pointer per record in each of them and an object
// per record, marking a store of 200,000 records took several times as long
// (BenchmarkParts/store/first in benchmarks/peers measures the store's calls).
//
// A removed record's slot is filled with the last record (moved: its index or
// chain entry and its queue or heap item follow it), so the blocks stay as many
// as the records need and an emptied block goes back to the collector (one is
// kept spare, so a count that wavers around a block boundary allocates none).
// A *entry is valid only under the shard lock and until the next removal.

// blockLen is the number of entries in a block: 46 entries of 176 bytes fill an
// 8 KiB size class to within 1%.
const blockLen = 46

type block [blockLen]entry

// ref is a record's slot in its shard: 1..n; 0 is none.
type ref int32

// at returns the record in slot r (1 <= r <= n).
func (sh *shard) at(r ref) *entry {
	i := int(r) - 1
	return &sh.blocks[i/blockLen][i%blockLen]
}

// find returns the record of id in the chain that starts at r (nil: none).
func (sh *shard) find(r ref, id store.ID) *entry {
	for r != 0 {
		e := sh.at(r)
		if e.id == id {
			return e
		}
		r = e.next
	}
	return nil
}

// alloc returns a zeroed slot for a new record, its self set.
func (sh *shard) alloc() *entry {
	if int(sh.n) == len(sh.blocks)*blockLen {
		b := sh.spare
		if b == nil {
			b = new(block)
		}
		sh.spare = nil
		sh.blocks = append(sh.blocks, b)
	}
	sh.n++
	e := sh.at(ref(sh.n))
	e.self = ref(sh.n)
	return e
}

// free empties the slot of e, which is out of the index, the chains and the
// expiry structures, by moving the last record into it.
func (sh *shard) free(e *entry) {
	last := sh.at(ref(sh.n))
	if last != e {
		self := e.self
		*e = *last
		e.self = self
		sh.relink(e, last.self)
	}
	*last = entry{}
	sh.n--
	if int(sh.n)%blockLen == 0 {
		k := len(sh.blocks) - 1
		if sh.spare == nil {
			sh.spare = sh.blocks[k] // zeroed: every slot was freed
		}
		sh.blocks[k] = nil
		sh.blocks = sh.blocks[:k]
	}
}

// relink points the references to the record that was in slot old (the index or
// the chain before it, its queue or heap item) to its slot now, e.self.
func (sh *shard) relink(e *entry, old ref) {
	if head := sh.records.get(sh, e.hash); head == old {
		sh.records.set(sh, e.hash, e.self)
	} else {
		for p := sh.at(head); ; p = sh.at(p.next) {
			if p.next == old {
				p.next = e.self
				break
			}
		}
	}
	if e.queued {
		sh.queue.item(uint32(e.index)).ref = e.self
	} else {
		sh.expiry[e.index].ref = e.self
	}
}
