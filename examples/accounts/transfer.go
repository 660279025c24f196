package accounts

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/writeloop"
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
	a := &transferAttempt{s: s, from: from, to: to, amount: amountCents, eventID: eventID, landed: mayHaveLanded(ctx), fs: fs, ts: ts, caught: true}
	out, err := s.loop().Run(ctx, a)
	switch {
	case err != nil:
		return TransferResult{}, s.loopError(err, fmt.Sprintf("transfer %s -> %s", from, to))
	case out == writeloop.Found:
		return a.answer, nil
	case out == writeloop.Owned:
		fs, ts, res, done, err := s.catchUpTransfer(ctx, from, to, eventID)
		if err != nil || done {
			return res, err
		}
		return TransferResult{From: fs.result(), To: ts.result()}, nil
	}
	res = TransferResult{
		From: Result{BalanceCents: a.fs.BalanceCents - int64(amountCents), AggregateVersion: a.fs.Version + 1},
		To:   Result{BalanceCents: a.ts.BalanceCents + int64(amountCents), AggregateVersion: a.ts.Version + 1},
	}
	// Two separate records, not atomic with each other: each is self-consistent for its
	// own account (docs/account-service.md section 6.2.8).
	s.record(ctx, from, eventID, res.From, a.fs.Version, a.fseq)
	s.record(ctx, to, eventID, res.To, a.ts.Version, a.tseq)
	return res, nil
}

// transferAttempt is the Attempt of a transfer: one write to both accounts.
type transferAttempt struct {
	s        *Service
	from, to uuid.UUID
	amount   int32
	eventID  uuid.UUID
	landed   bool

	fs, ts     State
	caught     bool // fs and ts are fresh from the caller's catch-up: the first Prepare uses them
	fseq, tseq uint64
	searched   bool
	answer     TransferResult
}

func (a *transferAttempt) Prepare(ctx context.Context, _ int, reDerive bool) (bool, error) {
	if !a.caught {
		fs, ts, res, done, err := a.s.catchUpTransfer(ctx, a.from, a.to, a.eventID)
		if err != nil || done {
			a.answer = res
			return done, err
		}
		a.fs, a.ts = fs, ts
	}
	a.caught = false
	fs, ts := a.fs, a.ts
	if reDerive {
		if a.landed && !a.searched {
			a.searched = true
			// The write is all-or-nothing: found on the from leg means both landed.
			fres, found, err := a.s.searchLanded(ctx, a.from, fs, a.eventID)
			if err != nil {
				return false, err
			}
			if found {
				tres, tfound, err := a.s.searchLanded(ctx, a.to, ts, a.eventID)
				if err != nil {
					return false, err
				}
				if !tfound {
					tres = ts.result()
				}
				a.answer = TransferResult{From: fres, To: tres}
				return true, nil
			}
		}
		a.fseq, a.tseq = fs.MaxClientSeq+1, ts.MaxClientSeq+1
	}
	if err := validateAmount(a.amount); err != nil {
		return false, err
	}
	if fs.BalanceCents < int64(a.amount) {
		return false, &InsufficientFundsError{BalanceCents: fs.BalanceCents, RequestedCents: int64(a.amount)}
	}
	return false, nil
}

func (a *transferAttempt) Write(ctx context.Context) error {
	_, err := a.s.store.Write(ctx, celeriant.WriteRequest{
		ClientID: a.s.clientID,
		Writes: []celeriant.AggregateWrite{
			{
				Key:                      Key(a.from),
				Events:                   []celeriant.Event{{ClientSeq: a.fseq, EventID: a.eventID, TypeMajor: uint64(TransferredOut), Value: encodePayload(TransferredOut, a.amount, a.to)}},
				AllowCreate:              true,
				ExpectedVersion:          celeriant.Version(a.fs.Version),
				EnforceClientIdempotency: true,
			},
			{
				Key:                      Key(a.to),
				Events:                   []celeriant.Event{{ClientSeq: a.tseq, EventID: a.eventID, TypeMajor: uint64(TransferredIn), Value: encodePayload(TransferredIn, a.amount, a.from)}},
				AllowCreate:              true,
				ExpectedVersion:          celeriant.Version(a.ts.Version),
				EnforceClientIdempotency: true,
			},
		},
	})
	if writeloop.Classify(err) == writeloop.Hold {
		a.s.log.DebugContext(ctx, "accounts: holding transfer ClientSeqs", "from", a.from, "to", a.to, "from_seq", a.fseq, "to_seq", a.tseq, "err", err)
	}
	return err
}

// Owner attributes a 2002: the error does not say which leg, and Unwritten on one leg
// just means the violation was on the other.
func (a *transferAttempt) Owner(ctx context.Context) (writeloop.Verdict, error) {
	v, err := writeloop.WhoOwnsSeq(ctx, a.s.store, Key(a.from), a.s.clientID, a.fseq, a.eventID)
	if err == nil && v == writeloop.Unwritten {
		v, err = writeloop.WhoOwnsSeq(ctx, a.s.store, Key(a.to), a.s.clientID, a.tseq, a.eventID)
	}
	return v, a.s.fatal(err)
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
