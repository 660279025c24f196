package accounts

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/google/uuid"
)

// EventType is an account event's event_type_major (docs/account-service.md section 2.2). The minor
// type is always 0.
type EventType uint64

// The four account events. Payloads are UTF-8 JSON with PascalCase keys, as written by the
// C# and Rust reference ports.
const (
	// Deposited: {"AmountCents":int32}; balance += amount.
	Deposited EventType = 1
	// Withdrawn: {"AmountCents":int32}; balance -= amount.
	Withdrawn EventType = 2
	// TransferredOut, on the debited account: {"AmountCents":int32,"ToAccountId":"<uuid>"};
	// balance -= amount.
	TransferredOut EventType = 3
	// TransferredIn, on the credited account: {"AmountCents":int32,"FromAccountId":"<uuid>"};
	// balance += amount.
	TransferredIn EventType = 4
)

// String returns the name used in history responses: Deposited, Withdrawn,
// TransferredOut, TransferredIn, or Unknown.
func (t EventType) String() string {
	switch t {
	case Deposited:
		return "Deposited"
	case Withdrawn:
		return "Withdrawn"
	case TransferredOut:
		return "TransferredOut"
	case TransferredIn:
		return "TransferredIn"
	}
	return "Unknown"
}

// payload is the JSON body of every account event.
type payload struct {
	AmountCents   int32      `json:"AmountCents"`
	ToAccountID   *uuid.UUID `json:"ToAccountId,omitempty"`
	FromAccountID *uuid.UUID `json:"FromAccountId,omitempty"`
}

// encodePayload renders the payload of an event of type t without reflection.
// other is the counterpart account of a transfer leg and is ignored otherwise.
func encodePayload(t EventType, amount int32, other uuid.UUID) []byte {
	b := make([]byte, 0, 80)
	b = append(b, `{"AmountCents":`...)
	b = strconv.AppendInt(b, int64(amount), 10)
	switch t {
	case TransferredOut:
		b = append(b, `,"ToAccountId":"`...)
		b = append(b, other.String()...)
		b = append(b, '"')
	case TransferredIn:
		b = append(b, `,"FromAccountId":"`...)
		b = append(b, other.String()...)
		b = append(b, '"')
	}
	return append(b, '}')
}

// decodePayload parses an account event's payload.
func decodePayload(value []byte) (payload, error) {
	var p payload
	if err := json.Unmarshal(value, &p); err != nil {
		return payload{}, fmt.Errorf("accounts: undecodable event payload: %w", err)
	}
	return p, nil
}

// delta returns the balance change of one event. Unknown types and undecodable payloads
// fold as zero, as in the Rust reference (docs/account-service.md section 6.1.5): a projection must
// not stop on an event some other writer put in the stream.
func delta(typ uint64, value []byte) int64 {
	t := EventType(typ)
	if t < Deposited || t > TransferredIn {
		return 0
	}
	p, err := decodePayload(value)
	if err != nil {
		return 0
	}
	switch t {
	case Deposited, TransferredIn:
		return int64(p.AmountCents)
	default:
		return -int64(p.AmountCents)
	}
}
