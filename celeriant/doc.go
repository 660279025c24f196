// Package celeriant is a Go client for the Celeriant event store, speaking the client
// wire protocol v3 (17-byte little-endian frame header, MessagePack bodies) as described
// in docs/celeriant-protocol.md, pinned to celeriant-db commit e7c6df9. It has been
// verified against the derived byte vectors of docs/celeriant-protocol.md section 8.3, against the
// simulator in celeriant/celeriantsim, and once against a live server built from that
// commit (with some dependencies at other versions than its lockfile; sections 7.3 and
// 8.5; set CELERIANT_ADDR to run TestLiveServer against one).
//
// # API
//
// EventStore is the interface applications program against. Two implementations return
// the same values and the same errors:
//
//   - *Client (New, Dial): TCP, optional TLS, a small pool of connections per node,
//     one request in flight per connection (docs/celeriant-protocol.md section 2.3), idle connections
//     dropped after 25 s (the server closes at 30 s), requests routed to the leader
//     after a not-leader answer, context deadlines honoured, Close.
//   - *celeriantsim.Sim: the in-process simulator (also served over TCP).
//
// Operations:
//
//   - Write(ctx, WriteRequest) (WriteResult, error): one or more AggregateWrite entries
//     (key, events, AllowCreate, ExpectedVersion nil/0/n, EnforceClientIdempotency)
//     for one ClientID, committed atomically, one new version per aggregate.
//     WriteResult.Version is the new version when exactly one aggregate was written.
//   - Read(ctx, ReadRequest) (ReadResult, error): one page of batches with the 15
//     server filters of ReadFilters (FromVersion, Min/MaxClientSeq, IncludeClientID,
//     MinServerTimestamp, EventTypes, ...); ReadResult.NextVersion != 0 means "continue
//     from there". ReadAll follows the pages.
//   - AggregateDetails(ctx, AggregateKey) (AggregateDetails, error): current version
//     (MaxVersion), first readable version (MinVersion) and the last writer.
//
// Watcher (both implement it too) subscribes to change notifications:
// Watch(ctx, WatchRequest) (WatchStream, error), then WatchStream.Next for each frame
// of WatchEvents (an empty one is a heartbeat) and Close. A watch sees only what
// commits after it was acknowledged; a subscriber that falls behind is dropped by the
// server (docs/celeriant-protocol.md sections 4.9 and 6.11).
//
// Ids (organisation, aggregate type, aggregate, client, user, event, correlation) are
// uuid.UUID, sent as the 16 UUID bytes (big-endian u128); uuid.Nil means "absent" for
// the optional ones. Optional integers are *uint64 (Version and Uint64 build them).
// Timestamps are Unix epoch milliseconds.
//
// # Errors
//
// Match with errors.Is / errors.As; never parse messages.
//
//   - *ServerError: an ErrorResponse (docs/celeriant-protocol.md sections 4.8 and 5) with Code and the
//     JSON detail parsed into fields (LastClientSeq, AttemptedClientSeq, ExpectedVersion,
//     CurrentVersion, MinimumAvailable, LeaderAddress). errors.Is matches its Code
//     (errors.Is(err, CodeWriteOCC)) and the class sentinels ErrConflict (2003),
//     ErrIdempotencyViolation (2002), ErrInflightDuplicate (2013), ErrUnavailableVersion
//     (1000), ErrNotFound (1001/2005/7001), ErrNotLeader (2011/3005/4006) and ErrBusy
//     (11000/2012/3006/4007); predicates IsConflict, IsNotLeader, IsUnavailableVersion...
//   - ErrOutcomeUnknown: a write was sent and no answer came back; it may have
//     committed. The client never re-sends such a write by itself: the caller holds its
//     ClientSeq and retries with a fresh ExpectedVersion (docs/account-service.md section 3.3).
//   - ErrNotSent: the request never left as a complete frame (dial failure, context
//     done before sending, ErrInvalidRequest, ErrClosed); safe to retry.
//   - ErrTransport: a Read or AggregateDetails failed after sending; safe to retry.
//   - ErrProtocol: a malformed frame or message (also wrapped inside the above).
//
// # Wire level
//
// The codec (frame header, MessagePack bodies) is internal to this module: the client and
// the simulator share it, applications never need it. It is written entirely in this
// module against the MessagePack format (no MessagePack library), bounded against a
// hostile peer: no recursion, no allocation ahead of the bytes received. An event's IV
// is nil or exactly 12 bytes on the wire; an empty IV is sent as nil and an empty bin is
// refused, as the server does. The server answers malformed input by closing the
// connection without an error frame (docs/celeriant-protocol.md section 2.3).
//
// Package celeriant/writeloop is the idempotent write loop of docs/account-service.md
// section 3 (outcome arms, ClientSeq and EventId derivation, the ownership point read,
// back-off), for building Celeriant-backed handlers.
package celeriant
