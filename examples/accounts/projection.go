package accounts

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
)

// DefaultWindow is the dedup window of both projections (docs/account-service.md section 4.3): a
// request's response stays in the index for at least this long after its write, so a
// retry with the same idempotency key within it gets the original answer. It is a stated
// property of the API, not a safety boundary: after it a retry writes a second event.
const DefaultWindow = 90 * time.Second

// State is the projection of one account: what catch-up has folded from its stream.
type State struct {
	BalanceCents int64  // sum of the folded events, in cents
	Version      uint64 // the cursor: the last folded aggregate version (0 = nothing)
	MaxClientSeq uint64 // highest ClientSeq folded from batches of the service's client id
}

func (s State) result() Result {
	return Result{BalanceCents: s.BalanceCents, AggregateVersion: s.Version}
}

// Projection is the account projection with its dedup index, colocated with the cursor
// (docs/account-service.md section 4): whoever advances the cursor indexes the events it passes in
// the same motion, so no replica can see the cursor past an event without its index row.
// It is implemented by *MemoryProjection and *PostgresProjection; the set is closed.
//
// The index is keyed (EventId, account) and holds the response a request produced:
// {balance after its event, version of its batch}. It restores lost responses; it does not
// prevent double writes (the server's ClientSeq floor does).
type Projection interface {
	// lookup answers from the projection alone: the account's state and, when eventID is
	// not uuid.Nil and its entry is live, the indexed response (ok = true).
	lookup(ctx context.Context, acct, eventID uuid.UUID) (st State, hit Result, ok bool, err error)
	// fold applies batches read from the log after a lookup that returned from, indexes
	// their events (age measured in server time against the newest batch read, server
	// timestamps in ticks of precision), moves the cursor forward only, and answers as
	// lookup does.
	fold(ctx context.Context, acct uuid.UUID, from State, batches []celeriant.Batch, clientID, eventID uuid.UUID, precision celeriant.Precision) (st State, hit Result, ok bool, err error)
	// recordWrite indexes a successful write's response for the full window from now,
	// then bumps the cursor only if it still equals expected (docs/account-service.md section 4.1).
	recordWrite(ctx context.Context, acct, eventID uuid.UUID, res Result, expected, seq uint64) error
	// ensureAccount makes the account known under name, keeping existing state.
	ensureAccount(ctx context.Context, acct uuid.UUID, name string) error
}

// indexEntry is one event the fold indexes.
type indexEntry struct {
	eventID   uuid.UUID
	res       Result
	remaining time.Duration // window minus the event's age in server time
}

// foldBatches applies batches to st (docs/account-service.md section 4.1, the fold): batches at or
// below the cursor are skipped (an overlapping fold got there first); ClientSeq counts only
// from batches of clientID; every event with an EventId younger than window, measured
// against the newest batch of this read (server timestamps are ticks of precision, the
// server's --timestamp-precision), is passed to index with its remaining lifetime.
func foldBatches(st State, batches []celeriant.Batch, clientID uuid.UUID, window time.Duration, precision celeriant.Precision, index func(indexEntry)) State {
	if len(batches) == 0 {
		return st
	}
	tip := batches[len(batches)-1].ServerTimestamp
	for i := range batches {
		b := &batches[i]
		if b.Version <= st.Version {
			continue
		}
		st.Version = b.Version
		own := b.ClientID == clientID
		var age time.Duration
		if tip > b.ServerTimestamp {
			age = precision.Duration(tip - b.ServerTimestamp)
		}
		for j := range b.Events {
			ev := &b.Events[j]
			if own && ev.ClientSeq > st.MaxClientSeq {
				st.MaxClientSeq = ev.ClientSeq
			}
			st.BalanceCents += delta(ev.TypeMajor, ev.Value)
			if age < window && ev.EventID != uuid.Nil && index != nil {
				index(indexEntry{
					eventID:   ev.EventID,
					res:       Result{BalanceCents: st.BalanceCents, AggregateVersion: b.Version},
					remaining: window - age,
				})
			}
		}
	}
	return st
}
