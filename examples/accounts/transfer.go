package accounts

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
)

// Transfer moves amountCents from one account to another with one all-or-nothing write to
// both aggregates (docs/account-service.md section 3.6): TransferredOut on from and TransferredIn on
// to, one ClientSeq per leg, the same EventId on both. The answer carries each account's
// balance after its leg and its own version.
//
// A retry with the same eventID returns the original answer; an index hit on either leg
// proves the whole transfer landed (the partial-hit rule), and the other leg is then
// answered from its index entry or, if that is gone, its current state. Errors:
// ErrValidation (same account, amount <= 0), ErrInsufficientFunds (carrying the from
// balance), ErrConflict, ErrUnavailable. Both accounts must route to one Celeriant shard.
func (s *Service) Transfer(ctx context.Context, from, to uuid.UUID, amountCents int32, eventID uuid.UUID) (TransferResult, error) {
	if from == to {
		return TransferResult{}, &ValidationError{Message: "Cannot transfer to the same account."}
	}
	if eventID == uuid.Nil {
		eventID = NewEventID()
	}
	fs, ts, res, done, err := s.catchUpTransfer(ctx, from, to, eventID)
	if err != nil || done {
		return res, err
	}
	fromKey, toKey := Key(from), Key(to)
	outValue := encodePayload(TransferredOut, amountCents, to)
	inValue := encodePayload(TransferredIn, amountCents, from)
	fseq, tseq, reDerive := fs.MaxClientSeq+1, ts.MaxClientSeq+1, false
	for attempt := 1; attempt <= s.maxRetries; attempt++ {
		if attempt > 1 {
			if err := s.backoff(ctx, attempt); err != nil {
				return TransferResult{}, err
			}
			if fs, ts, res, done, err = s.catchUpTransfer(ctx, from, to, eventID); err != nil || done {
				return res, err
			}
			if reDerive {
				fseq, tseq, reDerive = fs.MaxClientSeq+1, ts.MaxClientSeq+1, false
			}
		}
		if err := validateAmount(amountCents); err != nil {
			return TransferResult{}, err
		}
		if fs.BalanceCents < int64(amountCents) {
			return TransferResult{}, &InsufficientFundsError{BalanceCents: fs.BalanceCents, RequestedCents: int64(amountCents)}
		}
		_, err := s.store.Write(ctx, celeriant.WriteRequest{
			ClientID: s.clientID,
			Writes: []celeriant.AggregateWrite{
				{
					Key:                      fromKey,
					Events:                   []celeriant.Event{{ClientSeq: fseq, EventID: eventID, TypeMajor: uint64(TransferredOut), Value: outValue}},
					AllowCreate:              true,
					ExpectedVersion:          celeriant.Version(fs.Version),
					EnforceClientIdempotency: true,
				},
				{
					Key:                      toKey,
					Events:                   []celeriant.Event{{ClientSeq: tseq, EventID: eventID, TypeMajor: uint64(TransferredIn), Value: inValue}},
					AllowCreate:              true,
					ExpectedVersion:          celeriant.Version(ts.Version),
					EnforceClientIdempotency: true,
				},
			},
		})
		switch classify(err) {
		case armSuccess:
			out := TransferResult{
				From: Result{BalanceCents: fs.BalanceCents - int64(amountCents), AggregateVersion: fs.Version + 1},
				To:   Result{BalanceCents: ts.BalanceCents + int64(amountCents), AggregateVersion: ts.Version + 1},
			}
			// Two separate records, not atomic with each other: each is self-consistent
			// for its own account (docs/account-service.md section 6.2.8).
			s.record(ctx, from, eventID, out.From, fs.Version, fseq)
			s.record(ctx, to, eventID, out.To, ts.Version, tseq)
			return out, nil
		case armReDerive:
			reDerive = true
		case armHold:
			s.log.DebugContext(ctx, "accounts: holding transfer ClientSeqs", "from", from, "to", to, "from_seq", fseq, "to_seq", tseq, "attempt", attempt, "err", err)
		case armOwnership:
			// The error does not say which leg; Unwritten on one leg just means the
			// violation was on the other.
			v, err := s.whoOwnsSeq(ctx, from, fseq, eventID)
			if err == nil && v == unwritten {
				v, err = s.whoOwnsSeq(ctx, to, tseq, eventID)
			}
			if err != nil {
				return TransferResult{}, err
			}
			switch v {
			case ours:
				fs, ts, res, done, err := s.catchUpTransfer(ctx, from, to, eventID)
				if err != nil || done {
					return res, err
				}
				return TransferResult{From: fs.result(), To: ts.result()}, nil
			case sibling:
				reDerive = true
			default:
				return TransferResult{}, &ConflictError{Reason: fmt.Sprintf("transfer %s -> %s unverifiable after idempotency violation at seqs %d/%d; retry the request", from, to, fseq, tseq)}
			}
		default:
			return TransferResult{}, s.fatal(err)
		}
	}
	return TransferResult{}, &ConflictError{Reason: fmt.Sprintf("transfer %s -> %s did not complete after %d attempts: concurrent updates or timeouts; retry the request", from, to, s.maxRetries)}
}

// catchUpTransfer catches up both accounts with the request's EventId and applies the
// partial-hit rule (docs/account-service.md section 3.6, resolve_transfer_hits). done reports that
// the transfer already landed and res is its answer; otherwise fs and ts are the fresh
// states to write against.
func (s *Service) catchUpTransfer(ctx context.Context, from, to, eventID uuid.UUID) (fs, ts State, res TransferResult, done bool, err error) {
	fs, fhit, fok, err := s.catchUp(ctx, from, eventID)
	if err != nil {
		return fs, ts, TransferResult{}, false, err
	}
	ts, thit, tok, err := s.catchUp(ctx, to, eventID)
	if err != nil {
		return fs, ts, TransferResult{}, false, err
	}
	switch {
	case fok && tok:
		return fs, ts, TransferResult{From: fhit, To: thit}, true, nil
	case fok:
		// The write is all-or-nothing, so the to leg landed too: its index entry may be
		// missing on this replica (deleted row, aged out). Never fall through to a write.
		thit, err := s.legAnswer(ctx, to, eventID)
		return fs, ts, TransferResult{From: fhit, To: thit}, true, err
	case tok:
		fhit, err := s.legAnswer(ctx, from, eventID)
		return fs, ts, TransferResult{From: fhit, To: thit}, true, err
	}
	return fs, ts, TransferResult{}, false, nil
}

// legAnswer catches acct up again and returns its index entry for eventID, or its current
// state when there is none (a rebuilt leg may differ from the original answer).
func (s *Service) legAnswer(ctx context.Context, acct, eventID uuid.UUID) (Result, error) {
	st, hit, ok, err := s.catchUp(ctx, acct, eventID)
	if err != nil {
		return Result{}, err
	}
	if ok {
		return hit, nil
	}
	return st.result(), nil
}
