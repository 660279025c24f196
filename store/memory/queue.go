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
// twice the records it holds, plus a block and the spare blocks (at most
// maxSpares). Called with the shard lock held.
type queue struct {
	chunks     []*chunk // chunks[0] holds head; len is ceil((tail-base)/chunkLen), base = head rounded down to a block
	spares     []*chunk // emptied blocks, zeroed, kept for the next ones needed (at most maxSpares)
	head, tail uint32
	dead       int32  // tombstones between head and tail; head and tail-1 are never one
	sh         *shard // the queue's shard, whose slots its items name
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
func (q *queue) push(e *entry) { q.pushItem(heapItem{at: e.expiresAt, ref: e.self}) }

func (q *queue) pushItem(it heapItem) {
	if int(q.tail-q.head&^(chunkLen-1)) == len(q.chunks)*chunkLen {
		var c *chunk
		if n := len(q.spares); n > 0 {
			c, q.spares[n-1] = q.spares[n-1], nil
			q.spares = q.spares[:n-1]
		} else {
			c = new(chunk)
		}
		q.chunks = append(q.chunks, c)
	}
	*q.item(q.tail) = it
	e := q.sh.at(it.ref)
	e.index, e.queued = int32(q.tail), true
	q.tail++
}

// remove takes the queued e out of the queue.
func (q *queue) remove(e *entry) {
	seq := uint32(e.index)
	e.queued = false
	switch seq {
	case q.head:
		q.popHead()
		for q.len() > 0 && q.item(q.head).ref == 0 {
			q.popHead()
			q.dead--
		}
	case q.tail - 1:
		q.popTail()
		for q.len() > 0 && q.item(q.tail-1).ref == 0 {
			q.popTail()
			q.dead--
		}
	default:
		q.item(seq).ref = 0 // keeps its at: the order holds
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
		q.keep(q.chunks[0])
		q.chunks[0] = nil
		q.chunks = q.chunks[1:]
	}
}

func (q *queue) popTail() {
	q.tail--
	*q.item(q.tail) = heapItem{}
	if (q.tail-q.head&^(chunkLen-1))%chunkLen == 0 { // the last block is empty
		last := len(q.chunks) - 1
		q.keep(q.chunks[last])
		q.chunks[last] = nil
		q.chunks = q.chunks[:last]
	}
}

// maxSpares bounds the emptied blocks a queue keeps (4 KiB): enough that a
// queue whose length wavers around a block boundary allocates none.
const maxSpares = 4

// keep keeps the emptied block c for reuse, or leaves it to the collector.
func (q *queue) keep(c *chunk) {
	if len(q.spares) < maxSpares {
		q.spares = append(q.spares, c)
	}
}

// compact rebuilds the queue without its tombstones, in order.
func (q *queue) compact() {
	old := *q
	*q = queue{spares: old.spares, sh: old.sh}
	for seq := old.head; seq != old.tail; seq++ {
		if it := old.item(seq); it.ref != 0 {
			q.pushItem(*it)
		}
	}
}
