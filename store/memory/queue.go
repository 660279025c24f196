package memory

// chunkLen is the number of items in one block of a queue (1 KiB).
const chunkLen = 64

type chunk [chunkLen]heapItem

// queue is a shard's FIFO of records by expiry: items head..tail-1 (sequence
// numbers, wrapping as uint32) in non-decreasing order of at, held in blocks of
// chunkLen that are allocated as the tail reaches them and dropped as the head
// leaves them, so a queue never copies its items to grow. An item's at is its
// record's deadline or earlier (see shard.setExpiry). A queued record knows its
// sequence number (entry.index); a record removed from the middle leaves a
// tombstone (an item with no record) until the head reaches it, and the queue is
// rebuilt without them when they outnumber the records, so its size stays within
// twice the records it holds (plus a block). Called with the shard lock held.
type queue struct {
	chunks     []*chunk // chunks[0] holds head; len is ceil((tail-base)/chunkLen), base = head rounded down to a block
	spare      *chunk   // an emptied block, zeroed, kept for the next one needed
	head, tail uint32
	dead       int32 // tombstones between head and tail; head and tail-1 are never one
}

// len returns the number of items, tombstones included.
func (q *queue) len() int { return int(q.tail - q.head) }

// live returns the number of records queued.
func (q *queue) live() int { return q.len() - int(q.dead) }

// item returns the item of sequence number seq (head <= seq < tail).
func (q *queue) item(seq uint32) *heapItem {
	off := seq - q.head&^(chunkLen-1)
	return &q.chunks[off/chunkLen][off%chunkLen]
}

// push appends e at e.expiresAt, which must be no earlier than the last item's at.
func (q *queue) push(e *entry) { q.pushItem(heapItem{at: e.expiresAt, e: e}) }

func (q *queue) pushItem(it heapItem) {
	if int(q.tail-q.head&^(chunkLen-1)) == len(q.chunks)*chunkLen {
		c := q.spare
		if c == nil {
			c = new(chunk)
		}
		q.spare = nil
		q.chunks = append(q.chunks, c)
	}
	*q.item(q.tail) = it
	it.e.index, it.e.queued = int32(q.tail), true
	q.tail++
}

// remove takes the queued e out of the queue.
func (q *queue) remove(e *entry) {
	seq := uint32(e.index)
	e.queued = false
	switch seq {
	case q.head:
		q.popHead()
		for q.len() > 0 && q.item(q.head).e == nil {
			q.popHead()
			q.dead--
		}
	case q.tail - 1:
		q.popTail()
		for q.len() > 0 && q.item(q.tail-1).e == nil {
			q.popTail()
			q.dead--
		}
	default:
		q.item(seq).e = nil // keeps its at: the order holds
		q.dead++
		if q.dead > 16 && int(q.dead) > q.live() {
			q.compact()
		}
	}
}

func (q *queue) popHead() {
	*q.item(q.head) = heapItem{}
	q.head++
	if q.head%chunkLen == 0 { // left chunks[0]
		q.spare = q.chunks[0]
		q.chunks[0] = nil
		q.chunks = q.chunks[1:]
	}
}

func (q *queue) popTail() {
	q.tail--
	*q.item(q.tail) = heapItem{}
	if (q.tail-q.head&^(chunkLen-1))%chunkLen == 0 { // the last block is empty
		last := len(q.chunks) - 1
		q.spare = q.chunks[last]
		q.chunks[last] = nil
		q.chunks = q.chunks[:last]
	}
}

// compact rebuilds the queue without its tombstones, in order.
func (q *queue) compact() {
	old := *q
	*q = queue{spare: old.spare}
	for seq := old.head; seq != old.tail; seq++ {
		if it := old.item(seq); it.e != nil {
			q.pushItem(*it)
		}
	}
}
