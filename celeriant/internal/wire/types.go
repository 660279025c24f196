package wire

import "github.com/google/uuid"

// The message types below are the client's public types: package celeriant declares
// each as an alias (celeriant.Event = wire.Event, ...), so they are documented here and
// used unchanged by the client and the simulator.

// AggregateKey identifies one event stream: organisation, aggregate type and aggregate
// id, each a 128-bit id sent as the 16 UUID bytes in RFC 4122 order (big-endian u128,
// docs/celeriant-protocol.md sections 3.2 and 4.2). Comparable, usable as a map key.
type AggregateKey struct {
	Org  uuid.UUID // organisation id
	Type uuid.UUID // aggregate type id
	ID   uuid.UUID // aggregate id; the default shard routing id (docs/celeriant-protocol.md section 6.9)
}

// String returns the display form org/type/id.
func (k AggregateKey) String() string {
	return k.Org.String() + "/" + k.Type.String() + "/" + k.ID.String()
}

// Event is one event (the server's DatablockAggregateEvent, docs/celeriant-protocol.md section 4.2).
// In a write the server fills EventSeq and keeps everything else as sent.
type Event struct {
	// ClientSeq is the writer's idempotency sequence for (aggregate, client id). Start at
	// 1: 0 means "no floor" to the server (docs/celeriant-protocol.md section 6.4).
	ClientSeq uint64
	// EventSeq is assigned by the server, +1 per event within the aggregate, from 1.
	// Ignored on write (send 0).
	EventSeq uint64
	// EventID is the writer's own id for the event, opaque to the server; the account
	// service puts the idempotency key's UUIDv5 here. uuid.Nil is sent as nil (absent).
	EventID uuid.UUID
	// Timestamp is the client-supplied event time, by convention Unix epoch
	// milliseconds; the server does not validate it.
	Timestamp uint64
	// TypeMajor is the event type; it must be non-zero (else code 2001).
	TypeMajor uint64
	// TypeMinor is the event type's minor version; free.
	TypeMinor uint64
	// Value is the opaque payload (MessagePack bin).
	Value []byte
	// IV is nil unless Value is AES-GCM encrypted: then exactly 12 bytes (another length
	// is refused with ErrInvalidRequest). When set the server skips schema validation.
	IV []byte
}

// WriteRequest is a write to one or more aggregates (docs/celeriant-protocol.md section 4.3). All
// entries commit atomically as one batch each, or none does.
type WriteRequest struct {
	// CorrelationID is echoed by the server. uuid.Nil lets the client pick one (it checks
	// the echo to detect a desynchronised connection).
	CorrelationID uuid.UUID
	// ClientID is the writer's stable identity; the sequence floor is kept per
	// (aggregate, ClientID). Required.
	ClientID uuid.UUID
	// UserID is stored with each batch and filterable on read; uuid.Nil = absent.
	UserID uuid.UUID
	// Writes has one entry per aggregate; keys must be distinct and it must not be empty
	// (an empty map is answered with 9002). Entries on different shards give 9001.
	Writes []AggregateWrite
}

// AggregateWrite is the write to one aggregate (SingleAggregateWrite, docs/celeriant-protocol.md
// section 4.3).
type AggregateWrite struct {
	// Key is the aggregate written; distinct across WriteRequest.Writes (else
	// ErrInvalidRequest).
	Key AggregateKey
	// Events land as one batch, i.e. one new version. At least one (else 2000).
	Events []Event
	// AllowCreate creates the aggregate if it does not exist (else 2005).
	AllowCreate bool
	// ExpectedVersion: nil = unconditional; n = commit only if the current version is
	// exactly n (else 2003); 0 = "must not exist yet". See Version.
	ExpectedVersion *uint64
	// EnforceClientIdempotency rejects the write with 2002 (or 2013 while the floor is
	// in flight) if its lowest ClientSeq is <= the (aggregate, client) floor
	// (docs/celeriant-protocol.md sections 6.2 step 5, 6.4, 6.5). Always true for idempotent writers.
	EnforceClientIdempotency bool
}

// WriteResult is the answer to a successful write (WriteResponse, docs/celeriant-protocol.md section 4.4).
type WriteResult struct {
	// CorrelationID is the server's echo of the request's (or the client-picked) id.
	CorrelationID uuid.UUID
	// Version is the version the write created; the server reports it only when the
	// request wrote exactly one aggregate, otherwise it is 0 (versions start at 1).
	Version uint64
}

// ReadRequest reads one aggregate (docs/celeriant-protocol.md section 4.5). The encoded request must fit
// in 1007 bytes (a fixed-size message): very long EventTypes lists are refused with
// ErrNotSent.
type ReadRequest struct {
	CorrelationID uuid.UUID // uuid.Nil lets the client pick one
	// Key is the aggregate read; a missing or deleted one gives 1001 (ErrNotFound).
	Key AggregateKey
	// Filters select batches and events; the zero value reads the whole stream from
	// version 1, one page at a time (ReadResult.NextVersion).
	Filters ReadFilters
}

// ReadFilters are the server's 15 read filters, in wire order (docs/celeriant-protocol.md section 4.5).
// Nil pointers and uuid.Nil mean "no filter". Batch-level filters keep or drop whole
// batches; the event-level ones (client seq, event timestamp, event seq, event types) then
// drop events, and a batch left empty is omitted.
type ReadFilters struct {
	// FromVersion is the inclusive first version. The EventStore implementations send 0
	// as 1, like the official clients; a version below the first available one (after a
	// trim) gives code 1000 with the minimum available version. Beyond the tip: empty page.
	FromVersion uint64
	// ToVersion is the inclusive last version.
	ToVersion *uint64
	// EventTypes keeps only events whose TypeMajor is listed; empty = no filter.
	EventTypes []uint64
	// ExcludeClientID drops batches written by this client.
	ExcludeClientID uuid.UUID
	// IncludeClientID keeps only batches written by this client.
	IncludeClientID uuid.UUID
	// ExcludeUserID drops batches with this user id.
	ExcludeUserID uuid.UUID
	// IncludeUserID keeps only batches with this user id (batches without one are dropped).
	IncludeUserID uuid.UUID
	// MinServerTimestamp keeps batches with server timestamp >= value (inclusive, epoch ms).
	MinServerTimestamp *uint64
	// MaxServerTimestamp keeps batches with server timestamp <= value (epoch ms).
	MaxServerTimestamp *uint64
	// MinClientSeq keeps events with ClientSeq >= value.
	MinClientSeq *uint64
	// MaxClientSeq keeps events with ClientSeq <= value.
	MaxClientSeq *uint64
	// MinEventTimestamp keeps events with Event.Timestamp >= value (the client's clock,
	// epoch ms by convention).
	MinEventTimestamp *uint64
	// MaxEventTimestamp keeps events with Event.Timestamp <= value.
	MaxEventTimestamp *uint64
	// MinEventSeq keeps events with EventSeq >= value (EventSeq counts from 1).
	MinEventSeq *uint64
	// MaxEventSeq keeps events with EventSeq <= value.
	MaxEventSeq *uint64
}

// Batch is one committed write to one aggregate (AggregateEventBatch, docs/celeriant-protocol.md
// section 4.6).
type Batch struct {
	// Version is the batch's aggregate version (one batch per write, +1 each).
	Version uint64
	// ClientID wrote the whole batch.
	ClientID uuid.UUID
	// UserID is uuid.Nil when absent.
	UserID uuid.UUID
	// ServerTimestamp is the server's clock when it prepared the batch, epoch ms.
	ServerTimestamp uint64
	// Events in written order, EventSeq filled in; event-level filters may have dropped
	// some, never all (an emptied batch is omitted).
	Events []Event
}

// ReadResult is one page of a read (ReadResponse, docs/celeriant-protocol.md section 4.6).
type ReadResult struct {
	// CorrelationID is the server's echo of the request's id.
	CorrelationID uuid.UUID
	// Batches in ascending version order.
	Batches []Batch
	// NextVersion is 0 when there is nothing more; otherwise the page was cut and the
	// read continues with FromVersion = NextVersion. Only batches with Version <
	// NextVersion should be used from this page (docs/celeriant-protocol.md section 6.6).
	NextVersion uint64
}

// AggregateDetails describes an aggregate (AggregateDetailsResponse, docs/celeriant-protocol.md
// section 4.7).
type AggregateDetails struct {
	// CorrelationID is the server's echo of the request's id.
	CorrelationID uuid.UUID
	// MinVersion is the first readable version (1, or the trim point).
	MinVersion uint64
	// MaxVersion is the current version (counted from 1, +1 per write): the value for
	// ExpectedVersion.
	MaxVersion uint64
	// MaxEventSeq is the last assigned EventSeq (counted from 1 per aggregate).
	MaxEventSeq uint64
	// IsDeleted reports a soft-deleted aggregate (docs/celeriant-protocol.md section 6.7); reads of
	// it give 1001. The simulator has no delete, so false there.
	IsDeleted bool
	// AllowRecreate is the deleting request's allow_recreate: a write may create the
	// aggregate again (else 2006).
	AllowRecreate bool
	// AllowSequenceContinuation is the deleting request's allow_sequence_continuation:
	// a recreated aggregate continues the old version counter (section 6.7).
	AllowSequenceContinuation bool
	// LastServerTimestamp is the newest batch's ServerTimestamp, epoch ms.
	LastServerTimestamp uint64
	// LastClientID is the ClientID that wrote the newest batch.
	LastClientID uuid.UUID
	LastUserID   uuid.UUID // uuid.Nil when absent
}
