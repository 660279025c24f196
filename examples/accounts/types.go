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
	AggregateVersion uint64
	// Timestamp is the batch's server timestamp, epoch milliseconds.
	Timestamp   uint64
	Type        EventType
	AmountCents int32
	// ToAccountID is set on TransferredOut, FromAccountID on TransferredIn.
	ToAccountID, FromAccountID *uuid.UUID
}

// History is an account's event list plus the projection's view of it.
type History struct {
	Events                  []HistoryEvent
	CurrentAggregateVersion uint64
	BalanceCents            int64
}
