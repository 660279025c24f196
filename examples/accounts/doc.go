// Package accounts is the account service of the idemkey examples: a Go port of
// Celeriant's reference account service (docs/account-service.md), whose writes are
// idempotent from the HTTP retry down to the event log.
//
// Deposit, Withdraw and Transfer append events to Celeriant (any celeriant.EventStore:
// the TCP client or the in-process simulator) with the write loop of docs/account-service.md
// section 3, run by package celeriant/writeloop:
//
//   - catch-up and the dedup-index check before the first attempt and every retry; an
//     index hit returns the request's original answer;
//   - business rules (amount > 0, enough funds) decided on each attempt's fresh state;
//   - ClientSeq derived from the stream, counting only batches of the service's client id
//     (ServiceClientID, shared by every replica), never from a process counter;
//   - the arms: 2003 re-derives the seq; an ambiguous outcome (celeriant.ErrOutcomeUnknown)
//     and 2013 hold it; 2002 asks who owns the seq with a point read scoped to the client
//     id (Ours: success; Sibling: re-derive; Unwritten: 409, never a guess);
//   - at most 3 attempts with a 100 ms * 2^(n-1) + [0, 50 ms) backoff before attempts 2
//     and 3 (WithMaxRetries, WithBackoff, WithSleep).
//
// The request's EventId is EventIDFor(scope, idempotency key, Operation(...)), a UUIDv5,
// so any key (UUID or not) is deduplicated, two scopes' keys never meet, and a key reused
// for a different operation (route, accounts or amount) is a different request; a request without a key gets a
// random EventId. A transfer is one all-or-nothing write to both accounts, one ClientSeq
// per leg and the same EventId on both; a retry that hits either leg's index entry is
// answered without writing (the partial-hit rule).
//
// The dedup index lives with the projection cursor (docs/account-service.md section 4): in memory
// per replica (MemoryProjection) or in Postgres shared by replicas (PostgresProjection,
// one SQL statement per persist). Entries live for the window (DefaultWindow, 90 s,
// configurable), measured in server time for replayed events and from the write for the
// writer's own entry (the examples' app sets the Postgres window to the middleware's
// retention). A request marked MayHaveLanded (the middleware's claim was a takeover)
// that misses the index searches the stream's recent history for its EventId, in server
// time (WithLandedLookback), before deriving a ClientSeq: a late retry after a takeover
// does not write twice. Otherwise, after the window a retry writes again: the window is a stated
// property, not a safety boundary. The server's ClientSeq floor, not the index, is what
// prevents double writes.
//
// Differences from the reference, all deliberate: a non-UUID key is hashed instead of
// replaced by a random id; a stream trimmed below a read (code 1000) is re-read once from
// the minimum available version in catch-up, the ownership check and history; server busy
// and not-leader answers map to ErrUnavailable (503) like connection failures; 2007
// (replication error, write not acknowledged) holds the ClientSeq like a timeout; the
// Postgres lookup sees an index row even before the account's projection row exists.
//
// Errors: ErrValidation and ErrInsufficientFunds (422), ErrConflict (409),
// ErrUnavailable (503: Celeriant, or the Postgres projection's database, unreachable);
// package httpapi maps them to problem details.
package accounts
