package accounts

import (
	"errors"
	"fmt"
)

// Error classes returned by the service. Match with errors.Is; the HTTP mapping
// (docs/account-service.md section 1.3, docs/architecture.md section 6) is:
//
//	ErrValidation        422 VALIDATION_ERROR
//	ErrInsufficientFunds 422 INSUFFICIENT_FUNDS (with balanceCents, see *InsufficientFundsError)
//	ErrConflict          409 CONFLICT (the write loop gave up, or the outcome is unverifiable)
//	ErrUnavailable       503 (the event store, or the Postgres projection's database,
//	                     cannot be reached)
//
// Anything else is an internal error (500).
var (
	ErrValidation        = errors.New("accounts: validation failed")
	ErrInsufficientFunds = errors.New("accounts: insufficient funds")
	ErrConflict          = errors.New("accounts: account was modified concurrently")
	ErrUnavailable       = errors.New("accounts: event store or projection unavailable")
)

// ValidationError is a request the business rules refuse: a non-positive amount, or a
// transfer to the same account (docs/account-service.md section 1.3).
type ValidationError struct {
	// Message is one sentence safe to show to the caller, e.g. "Amount must be positive.".
	Message string
}

// Error returns "accounts: " + Message.
func (e *ValidationError) Error() string { return "accounts: " + e.Message }

// Is makes errors.Is(err, ErrValidation) true.
func (e *ValidationError) Is(target error) bool { return target == ErrValidation }

// InsufficientFundsError is a withdraw or transfer above the balance of the debited
// account, decided on the state of the attempt that refused it.
type InsufficientFundsError struct {
	BalanceCents   int64 // balance of the debited account, in cents
	RequestedCents int64 // amount asked for, in cents
}

// Error returns "accounts: cannot process $R.RR, balance is $B.BB" (amounts in dollars).
func (e *InsufficientFundsError) Error() string {
	return fmt.Sprintf("accounts: cannot process %s, balance is %s", dollars(e.RequestedCents), dollars(e.BalanceCents))
}

// Is makes errors.Is(err, ErrInsufficientFunds) true.
func (e *InsufficientFundsError) Is(target error) bool { return target == ErrInsufficientFunds }

// ConflictError is the write loop giving up (docs/account-service.md section 3.3): the retries ran
// out on 2003/2013/ambiguous outcomes, or a 2002 could not be attributed (Unwritten).
// The caller gets a fixed message and may retry with the same key.
type ConflictError struct {
	Reason string // the internal cause, for logs only; never shown to the caller
}

// Error returns "accounts: conflict: " + Reason.
func (e *ConflictError) Error() string { return "accounts: conflict: " + e.Reason }

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// dollars renders cents as $D.CC, as in the reference's message.
func dollars(c int64) string {
	sign := ""
	if c < 0 {
		sign, c = "-", -c
	}
	return fmt.Sprintf("%s$%d.%02d", sign, c/100, c%100)
}
