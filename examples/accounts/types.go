package accounts

import "github.com/google/uuid"

// Result is the state of one account as a write or balance read reports it.
type Result struct {
	// BalanceCents is the balance after the request's event (a write) or the
	// projection's balance (a read), in cents.
	BalanceCents int64
	// AggregateVersion is the version of the batch holding the request's event (a
	// write: expectedVersion+1) or the projection's cursor (a read). 0: no events.
	AggregateVersion uint64
}

// TransferResult is the answer to a transfer: From is the debited account and To the
// credited one, each with its own version.
type TransferResult struct {
	From, To Result
}

// HistoryEvent is one account event as GET /api/accounts/{id}/history reports it.
type HistoryEvent struct {
	// AggregateVersion is the version of the batch holding the event (counted from 1).
	AggregateVersion uint64
	// Timestamp is the batch's server timestamp, epoch milliseconds.
	Timestamp uint64
	// Type is the event's TypeMajor; String gives "Unknown" for a foreign type.
	Type EventType
	// AmountCents is the payload's amount, in cents; 0 for an unknown type or an
	// undecodable payload.
	AmountCents int32
	// ToAccountID is set on TransferredOut, FromAccountID on TransferredIn.
	ToAccountID, FromAccountID *uuid.UUID
}

// History is an account's event list plus the projection's view of it.
type History struct {
	// Events are every event from the requested version, in version order and in
	// written order within a batch.
	Events []HistoryEvent
	// CurrentAggregateVersion is the projection's cursor after catch-up (0: no events).
	CurrentAggregateVersion uint64
	// BalanceCents is the projection's balance after catch-up, in cents.
	BalanceCents int64
}
