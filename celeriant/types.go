package celeriant

import (
	"context"

	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// EventStore is the part of Celeriant an application needs for idempotent writes:
// conditional writes, filtered reads and the cheap version probe. It is implemented by
// the TCP client (*Client) and by the in-process simulator
// (*celeriantsim.Sim), which return the same error values, so code written against
// EventStore behaves identically in-process and over the wire.
//
// Errors (all matched with errors.Is / errors.As):
//   - *ServerError for every error code of docs/celeriant-protocol.md section 5 (see Code, and the
//     class sentinels ErrConflict, ErrIdempotencyViolation, ErrInflightDuplicate, ...);
//   - ErrOutcomeUnknown: a write was sent and no answer came back (timeout, reset, EOF);
//     it may or may not have been committed. Never returned by Read or AggregateDetails;
//   - ErrNotSent: nothing was sent (dial failure, context done before sending, request
//     too large or invalid); the request certainly had no effect;
//   - ErrTransport: a Read or AggregateDetails failed after it was sent;
//   - ErrClosed: the store was closed.
type EventStore interface {
	// Write appends one batch per aggregate of req, atomically across all of them
	// (docs/celeriant-protocol.md sections 4.3 and 6.1). It is never re-sent by the client.
	Write(ctx context.Context, req WriteRequest) (WriteResult, error)
	// Read returns one page of batches of one aggregate (docs/celeriant-protocol.md sections 4.5, 4.6,
	// 6.6). Follow ReadResult.NextVersion, or use ReadAll.
	Read(ctx context.Context, req ReadRequest) (ReadResult, error)
	// AggregateDetails returns the version counters of an aggregate (docs/celeriant-protocol.md
	// section 4.7); a missing aggregate gives a *ServerError with code 7001 (ErrNotFound).
	AggregateDetails(ctx context.Context, key AggregateKey) (AggregateDetails, error)
}

// Size limits of the server's defaults (docs/celeriant-protocol.md section 2.2), the
// defaults of Config.MaxRequestSize and Config.MaxResponseSize.
const (
	// DefaultMaxRequestSize is the server's default --max-request-size (16 MiB).
	DefaultMaxRequestSize = wire.DefaultMaxRequestSize
	// DefaultMaxResponseSize is the server's default --max-response-size (64 MiB).
	DefaultMaxResponseSize = wire.DefaultMaxResponseSize
)

// The message types. Each is an alias of the codec's type, so the client, the simulator
// and the codec share one definition; the field documentation is repeated in short here.
type (
	// AggregateKey identifies one event stream: organisation, aggregate type and
	// aggregate id (Org, Type, ID), each a 128-bit id sent as the 16 UUID bytes
	// (big-endian u128, docs/celeriant-protocol.md sections 3.2 and 4.2). Comparable,
	// usable as a map key; String gives org/type/id.
	AggregateKey = wire.AggregateKey
	// Event is one event (docs/celeriant-protocol.md section 4.2): ClientSeq (the
	// writer's idempotency sequence for (aggregate, client id), from 1), EventSeq
	// (server-assigned, ignored on write), EventID (the writer's own id, uuid.Nil =
	// absent), Timestamp (client time, epoch ms by convention), TypeMajor (non-zero),
	// TypeMinor, Value (opaque payload) and IV (nil, or exactly 12 bytes for an AES-GCM
	// encrypted Value; an empty IV is sent as absent).
	Event = wire.Event
	// WriteRequest is a write to one or more aggregates, committed all or nothing
	// (docs/celeriant-protocol.md section 4.3): CorrelationID (uuid.Nil: the client
	// picks one), ClientID (required), UserID (uuid.Nil = absent) and Writes (one
	// entry per distinct aggregate, at least one).
	WriteRequest = wire.WriteRequest
	// AggregateWrite is the write to one aggregate (docs/celeriant-protocol.md section
	// 4.3): Key, Events (one batch, at least one event), AllowCreate, ExpectedVersion
	// (nil = unconditional, 0 = must not exist, n = current version must be n; see
	// Version) and EnforceClientIdempotency (2002/2013 below the ClientSeq floor).
	AggregateWrite = wire.AggregateWrite
	// WriteResult is the answer to a write (docs/celeriant-protocol.md section 4.4):
	// CorrelationID and Version (the new version when exactly one aggregate was
	// written, else 0).
	WriteResult = wire.WriteResult
	// ReadRequest reads one page of one aggregate (docs/celeriant-protocol.md section
	// 4.5): CorrelationID, Key and Filters. The encoded request must fit in 1007 bytes.
	ReadRequest = wire.ReadRequest
	// ReadFilters are the server's 15 read filters in wire order
	// (docs/celeriant-protocol.md section 4.5); nil pointers and uuid.Nil mean "no
	// filter". FromVersion 0 is sent as 1; timestamps are epoch ms, inclusive.
	ReadFilters = wire.ReadFilters
	// Batch is one committed write to one aggregate (docs/celeriant-protocol.md section
	// 4.6): Version, ClientID, UserID, ServerTimestamp (epoch ms) and Events.
	Batch = wire.Batch
	// ReadResult is one page of a read (docs/celeriant-protocol.md section 4.6):
	// CorrelationID, Batches (ascending versions) and NextVersion (0: no more pages;
	// else continue from there, using only batches below it).
	ReadResult = wire.ReadResult
	// AggregateDetails describes an aggregate (docs/celeriant-protocol.md section 4.7):
	// MinVersion (first readable), MaxVersion (current, the value for
	// ExpectedVersion), MaxEventSeq, IsDeleted, AllowRecreate,
	// AllowSequenceContinuation, LastServerTimestamp (epoch ms), LastClientID and
	// LastUserID.
	AggregateDetails = wire.AggregateDetails
)

// Version returns &v, for AggregateWrite.ExpectedVersion and optional filters.
func Version(v uint64) *uint64 { return &v }

// Uint64 returns &v, for the optional uint64 fields of ReadFilters.
func Uint64(v uint64) *uint64 { return &v }

// ReadAll reads every page of req from s, following NextVersion (docs/celeriant-protocol.md section
// 6.6), and returns the batches in version order. It stops at the first error.
func ReadAll(ctx context.Context, s EventStore, req ReadRequest) ([]Batch, error) {
	var out []Batch
	for {
		res, err := s.Read(ctx, req)
		if err != nil {
			return out, err
		}
		for _, b := range res.Batches {
			if res.NextVersion == 0 || b.Version < res.NextVersion {
				out = append(out, b)
			}
		}
		if res.NextVersion == 0 {
			return out, nil
		}
		if res.NextVersion <= req.Filters.FromVersion {
			return out, errProtocolf("read: next version %d does not advance from %d", res.NextVersion, req.Filters.FromVersion)
		}
		req.Filters.FromVersion = res.NextVersion
	}
}
