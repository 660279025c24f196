// Package writeloop is the idempotent write loop of docs/account-service.md section 3,
// for any handler that appends events to Celeriant on behalf of a retried request: the
// outcome arms (section 3.3), the ownership point read after a 2002 (section 3.4),
// back-off between attempts, ClientSeq derivation from the stream (section 3.2), EventId
// derivation from the request (docs/architecture.md section 5) and the bounded search
// of recent history for a write that may have landed (docs/account-service.md section
// 4.3).
//
// A handler implements Attempt (catch up and decide, write, attribute a 2002) and runs
// it with Loop.Run. The pieces are usable alone: Classify, WhoOwnsSeq, MaxClientSeq,
// EventID, FindEvent, Backoff.
//
// The loop never re-sends a write by itself and never guesses: an ambiguous outcome
// holds the ClientSeq (the server's floor then rejects a duplicate with 2002, and the
// point read tells whose write holds it), a 2003 derives a fresh one after catching up,
// and a 2002 that cannot be attributed ends with ErrUnverifiable.
package writeloop

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/internal/sleep"
)

// Arm is the branch of the loop a write's outcome selects (docs/account-service.md
// section 3.3).
type Arm int

const (
	// Success: the write committed.
	Success Arm = iota
	// ReDerive: 2003 (optimistic concurrency violation), nothing was appended; catch up
	// and derive a fresh ClientSeq.
	ReDerive
	// Hold: the outcome is ambiguous (celeriant.ErrOutcomeUnknown, 2007 replication
	// error) or the floor is in flight (2013); keep the ClientSeq, take a fresh version.
	Hold
	// Ownership: 2002, the ClientSeq is already used; ask WhoOwnsSeq.
	Ownership
	// Fatal: anything else; the loop ends with the error.
	Fatal
)

// String returns the arm's name, e.g. "ReDerive".
func (a Arm) String() string {
	if a < Success || a > Fatal {
		return fmt.Sprintf("Arm(%d)", int(a))
	}
	return [...]string{"Success", "ReDerive", "Hold", "Ownership", "Fatal"}[a]
}

// Classify maps a write's error (nil for success) to its arm.
func Classify(err error) Arm {
	switch {
	case err == nil:
		return Success
	case celeriant.IsConflict(err):
		return ReDerive
	case celeriant.IsOutcomeUnknown(err), celeriant.IsInflightDuplicate(err),
		errors.Is(err, celeriant.CodeWriteReplicationError):
		// 2007 (replication failed, not acknowledged) may still commit
		// (docs/celeriant-protocol.md section 5): holding the ClientSeq is safe.
		return Hold
	case celeriant.IsIdempotencyViolation(err):
		return Ownership
	}
	return Fatal
}

// Verdict is the answer of WhoOwnsSeq.
type Verdict int

const (
	// Unwritten: no event of the client id at that ClientSeq is visible. Never guess.
	Unwritten Verdict = iota
	// Ours: the event at that ClientSeq carries our EventId: the write landed.
	Ours
	// Sibling: another request of the same client id holds the ClientSeq.
	Sibling
)

// String returns the verdict's name, e.g. "Ours".
func (v Verdict) String() string {
	if v < Unwritten || v > Sibling {
		return fmt.Sprintf("Verdict(%d)", int(v))
	}
	return [...]string{"Unwritten", "Ours", "Sibling"}[v]
}

// WhoOwnsSeq is the point read of docs/account-service.md section 3.4: the batches of
// clientID holding seq on key, filtered to exactly that ClientSeq. A missing aggregate
// (1001) is Unwritten; a trimmed range (1000) is re-read once from the minimum
// available version. Other errors are returned wrapped, with Unwritten.
func WhoOwnsSeq(ctx context.Context, store celeriant.EventStore, key celeriant.AggregateKey, clientID uuid.UUID, seq uint64, eventID uuid.UUID) (Verdict, error) {
	req := celeriant.ReadRequest{Key: key, Filters: celeriant.ReadFilters{
		FromVersion:     1,
		IncludeClientID: clientID,
		MinClientSeq:    celeriant.Uint64(seq),
		MaxClientSeq:    celeriant.Uint64(seq),
	}}
	batches, err := readAll(ctx, store, req)
	switch {
	case celeriant.IsNotFound(err):
		return Unwritten, nil
	case err != nil:
		return Unwritten, fmt.Errorf("writeloop: ownership read of %s seq %d: %w", key, seq, err)
	}
	for _, b := range batches {
		if b.ClientID != clientID {
			continue
		}
		for _, ev := range b.Events {
			if ev.ClientSeq == seq {
				if ev.EventID == eventID {
					return Ours, nil
				}
				return Sibling, nil
			}
		}
	}
	return Unwritten, nil
}

// readAll is celeriant.ReadAll with one re-read from the minimum available version after
// a 1000 (the stream was trimmed below FromVersion).
func readAll(ctx context.Context, store celeriant.EventStore, req celeriant.ReadRequest) ([]celeriant.Batch, error) {
	batches, err := celeriant.ReadAll(ctx, store, req)
	if minAvail, ok := celeriant.IsUnavailableVersion(err); ok && minAvail > req.Filters.FromVersion {
		req.Filters.FromVersion = minAvail
		batches, err = celeriant.ReadAll(ctx, store, req)
	}
	return batches, err
}

// MaxClientSeq returns the highest ClientSeq of the events in batches written by
// clientID, or floor when it is higher. The next write uses MaxClientSeq + 1: ClientSeq
// is derived from the stream, never from a process counter, so every replica sharing
// clientID derives the same value (docs/account-service.md section 3.2).
func MaxClientSeq(floor uint64, batches []celeriant.Batch, clientID uuid.UUID) uint64 {
	for i := range batches {
		if batches[i].ClientID != clientID {
			continue
		}
		for _, ev := range batches[i].Events {
			floor = max(floor, ev.ClientSeq)
		}
	}
	return floor
}

// EventID returns the EventId of a request: a name-based UUID (version 5, RFC 9562
// section 5.5) in namespace over parts, each part preceded by its length as an unsigned
// varint, so ("ab","c") and ("a","bc") never meet. Pass the idempotency scope and key
// and a description of the operation (route and decided arguments): a retry of the same
// operation gets the same EventId, a different operation under the same key another one.
// namespace is part of the stored data's meaning: never change it once events exist.
func EventID(namespace uuid.UUID, parts ...string) uuid.UUID {
	h := sha1.New()
	h.Write(namespace[:])
	var n [binary.MaxVarintLen64]byte
	for _, p := range parts {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		h.Write([]byte(p))
	}
	var u uuid.UUID
	copy(u[:], h.Sum(nil))
	u[6] = (u[6] & 0x0f) | 0x50 // version 5
	u[8] = (u[8] & 0x3f) | 0x80 // RFC 9562 variant
	return u
}

// FindEvent searches key's recent history for eventID: the batches of clientID whose
// server timestamp is at least the aggregate's newest batch's minus lookback (server
// time, never the local clock; docs/account-service.md section 4.3, "scan on a miss"),
// lookback converted to the server's timestamp ticks in precision (the server's
// --timestamp-precision, which the caller configures: the protocol does not carry it).
// It returns the version of the batch holding the event. Cost: one AggregateDetails and
// one paged read. A missing aggregate is "not found"; other errors are returned wrapped.
// Use it before deriving a new ClientSeq when an earlier run of the same request may
// have landed beyond what the caller's dedup index remembers (a takeover).
func FindEvent(ctx context.Context, store celeriant.EventStore, key celeriant.AggregateKey, clientID, eventID uuid.UUID, lookback time.Duration, precision celeriant.Precision) (version uint64, found bool, err error) {
	d, err := store.AggregateDetails(ctx, key)
	switch {
	case celeriant.IsNotFound(err):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("writeloop: details of %s: %w", key, err)
	}
	since := uint64(0)
	if back := precision.Ticks(lookback); d.LastServerTimestamp > back {
		since = d.LastServerTimestamp - back
	}
	batches, err := readAll(ctx, store, celeriant.ReadRequest{Key: key, Filters: celeriant.ReadFilters{
		FromVersion:        max(d.MinVersion, 1),
		IncludeClientID:    clientID,
		MinServerTimestamp: celeriant.Uint64(since),
	}})
	switch {
	case celeriant.IsNotFound(err):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("writeloop: searching %s for event %s: %w", key, eventID, err)
	}
	for _, b := range batches {
		for _, ev := range b.Events {
			if ev.EventID == eventID {
				return b.Version, true, nil
			}
		}
	}
	return 0, false, nil
}

// Defaults of Loop and Backoff (docs/account-service.md section 3).
const (
	// DefaultMaxAttempts is the number of write attempts per request.
	DefaultMaxAttempts = 3
	// DefaultBackoffBase: the wait before attempt n >= 2 is base * 2^(n-1), so 200 ms
	// before attempt 2 and 400 ms before attempt 3.
	DefaultBackoffBase = 100 * time.Millisecond
	// DefaultBackoffJitter is the width of the uniform jitter added to each wait: [0, 50 ms).
	DefaultBackoffJitter = 50 * time.Millisecond
)

// Backoff is the wait between attempts. The zero value uses the defaults.
type Backoff struct {
	// Base is the wait unit: base * 2^(n-1) before attempt n >= 2 (0: DefaultBackoffBase;
	// negative: no wait).
	Base time.Duration
	// Jitter is the width of the uniform jitter added (0: DefaultBackoffJitter; negative:
	// none).
	Jitter time.Duration
	// Rand returns a uniform value in [0, n) (default math/rand/v2.Int64N).
	Rand func(n int64) int64
	// Sleep waits d or until ctx ends, returning ctx.Err() then (default: a timer).
	// Tests pass a recorder so nothing really sleeps.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Delay returns the wait before attempt (attempt >= 2; 0 for the first).
func (b Backoff) Delay(attempt int) time.Duration {
	if attempt < 2 {
		return 0
	}
	base, jitter := b.Base, b.Jitter
	if base == 0 {
		base = DefaultBackoffBase
	}
	if jitter == 0 {
		jitter = DefaultBackoffJitter
	}
	d := max(base, 0) << (attempt - 1)
	if jitter > 0 {
		rnd := b.Rand
		if rnd == nil {
			rnd = rand.Int64N
		}
		d += time.Duration(rnd(int64(jitter)))
	}
	return d
}

// Wait sleeps Delay(attempt); it returns ctx.Err() if ctx ends first.
func (b Backoff) Wait(ctx context.Context, attempt int) error {
	d := b.Delay(attempt)
	if b.Sleep != nil {
		return b.Sleep(ctx, d)
	}
	return sleep.Ctx(ctx, d)
}

// Attempt is the handler's side of the loop.
type Attempt interface {
	// Prepare runs before every attempt: catch up with the stream and report whether
	// the request already landed (done; the loop then ends with Found). When reDerive is
	// true (the first attempt, and after a 2003 or a Sibling verdict) it derives fresh
	// ClientSeqs from the caught-up state; otherwise it keeps the held ones and takes the
	// fresh expected versions. Business rules are decided here or in Write, on this
	// attempt's state.
	Prepare(ctx context.Context, attempt int, reDerive bool) (done bool, err error)
	// Write sends this attempt's write and returns its error (nil: committed). An error
	// that is not a Celeriant outcome (a business rule) ends the loop as is.
	Write(ctx context.Context) error
	// Owner attributes a 2002 of the last Write, usually with WhoOwnsSeq on each
	// aggregate written.
	Owner(ctx context.Context) (Verdict, error)
}

// Outcome is how a successful Run ended.
type Outcome int

const (
	// Written: this run's write committed.
	Written Outcome = iota + 1
	// Found: Prepare found the request already landed.
	Found
	// Owned: a 2002 was attributed to this request (Ours): an earlier attempt landed.
	// Catch up to answer.
	Owned
)

// String returns the outcome's name, e.g. "Written".
func (o Outcome) String() string {
	if o < Written || o > Owned {
		return fmt.Sprintf("Outcome(%d)", int(o))
	}
	return [...]string{"Written", "Found", "Owned"}[o-1]
}

// Errors of Run besides the Attempt's own. Both mean "the outcome is not known to be a
// write of this request": answer 409 and let the client retry with the same key.
var (
	// ErrExhausted: every attempt ended in ReDerive or Hold.
	ErrExhausted = errors.New("writeloop: attempts exhausted")
	// ErrUnverifiable: a 2002 whose ClientSeq holds no visible event (Unwritten).
	ErrUnverifiable = errors.New("writeloop: idempotency violation not attributable")
)

// Loop runs attempts. The zero value uses the defaults.
type Loop struct {
	// MaxAttempts is the number of write attempts (< 1: DefaultMaxAttempts).
	MaxAttempts int
	// Backoff is the wait before attempts 2 and later.
	Backoff Backoff
}

// Run drives a through at most MaxAttempts attempts (docs/account-service.md section
// 3.2): Prepare, Write, then the arm of Classify. Errors: the Attempt's (a business
// rule, a fatal Celeriant error, ctx.Err() during a wait), ErrUnverifiable or
// ErrExhausted (both wrapping the last write error).
func (l Loop) Run(ctx context.Context, a Attempt) (Outcome, error) {
	maxAttempts := l.MaxAttempts
	if maxAttempts < 1 {
		maxAttempts = DefaultMaxAttempts
	}
	reDerive := true
	var last error
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		if attempt > 1 {
			if err := l.Backoff.Wait(ctx, attempt); err != nil {
				return 0, err
			}
		}
		// Catch-up and the landed check before every attempt, then re-derive: this order
		// stops "ambiguous failure, then 2003, then blind re-derive" from writing twice.
		done, err := a.Prepare(ctx, attempt, reDerive)
		if err != nil {
			return 0, err
		}
		if done {
			return Found, nil
		}
		reDerive = false
		last = a.Write(ctx)
		switch Classify(last) {
		case Success:
			return Written, nil
		case ReDerive:
			reDerive = true
		case Hold:
		case Ownership:
			v, err := a.Owner(ctx)
			if err != nil {
				return 0, err
			}
			switch v {
			case Ours:
				return Owned, nil
			case Sibling:
				reDerive = true
			default:
				return 0, fmt.Errorf("%w: %w", ErrUnverifiable, last)
			}
		default:
			return 0, last
		}
	}
	return 0, fmt.Errorf("%w after %d attempts: %w", ErrExhausted, maxAttempts, last)
}
