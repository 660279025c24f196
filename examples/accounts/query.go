package accounts

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
)

// Accounts returns the fixed list of seeded accounts served by GET /api/accounts. Any
// other account UUID is accepted by every operation too (writes create the aggregate).
func (s *Service) Accounts() []Account { return SeededAccounts() }

// Balance returns the projection of acct after catch-up. When minVersion > 0 and the
// projection is already at or past it, Celeriant is not read. An unknown account is
// {0, 0}. Errors: ErrUnavailable or an internal error.
func (s *Service) Balance(ctx context.Context, acct uuid.UUID, minVersion uint64) (Result, error) {
	st, _, _, err := s.proj.lookup(ctx, acct, uuid.Nil)
	if err != nil {
		return Result{}, err
	}
	if minVersion > 0 && st.Version >= minVersion {
		return st.result(), nil
	}
	batches, err := s.readFrom(ctx, acct, st.Version+1)
	if err != nil || len(batches) == 0 {
		return st.result(), err
	}
	st, _, _, err = s.proj.fold(ctx, acct, st, batches, s.clientID, uuid.Nil, s.precision)
	return st.result(), err
}

// History catches acct up (for its balance and current version) and returns every event
// of its stream from fromVersion (0 or 1: the whole stream). Undecodable payloads are
// reported with amount 0. If the stream was trimmed below fromVersion, it starts at the
// minimum available version. An unknown account gives an empty History. Errors:
// ErrUnavailable or an internal error.
func (s *Service) History(ctx context.Context, acct uuid.UUID, fromVersion uint64) (History, error) {
	st, _, _, err := s.catchUp(ctx, acct, uuid.Nil)
	if err != nil {
		return History{}, err
	}
	batches, err := s.readFrom(ctx, acct, fromVersion)
	if err != nil {
		return History{}, err
	}
	h := History{CurrentAggregateVersion: st.Version, BalanceCents: st.BalanceCents, Events: make([]HistoryEvent, 0, len(batches))}
	for _, b := range batches {
		for _, ev := range b.Events {
			he := HistoryEvent{AggregateVersion: b.Version, Timestamp: s.epochMillis(b.ServerTimestamp), Type: EventType(ev.TypeMajor)}
			if he.Type < Deposited || he.Type > TransferredIn {
				h.Events = append(h.Events, he)
				continue
			}
			if p, err := decodePayload(ev.Value); err == nil {
				he.AmountCents = p.AmountCents
				if he.Type == TransferredOut {
					he.ToAccountID = p.ToAccountID
				}
				if he.Type == TransferredIn {
					he.FromAccountID = p.FromAccountID
				}
			}
			h.Events = append(h.Events, he)
		}
	}
	return h, nil
}

// Seed runs the startup seeding of docs/account-service.md section 2.4 for every seeded account, on
// every replica: make the account known to the projection, and if its stream is empty
// write one Deposited{seed} with expected version 0, ClientSeq 0, no EventId and no
// ClientSeq enforcement. A 2003 means another replica seeded first and is ignored. Other
// failures are logged and returned joined, after every account was tried. Then it checks
// the first seeded account's last server timestamp against the configured precision
// (WithTimestampPrecision) and the local clock: a server stamping in another precision
// fails Seed with an error wrapping celeriant.ErrPrecisionMismatch, since both windows
// measured in server time would be 1000 times off.
func (s *Service) Seed(ctx context.Context) error {
	var errs []error
	for _, a := range SeededAccounts() {
		if err := s.seedOne(ctx, a); err != nil {
			s.log.ErrorContext(ctx, "accounts: seeding failed", "account", a.ID, "name", a.Name, "err", err)
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return s.checkPrecision(ctx)
}

// checkPrecision checks the first seeded account's last server timestamp against the
// configured precision. A replica whose seed got a 2003 may find the other replica's
// seed still in flight (7001 until the server's fsync): it backs off and reads again,
// up to the write attempts.
func (s *Service) checkPrecision(ctx context.Context) error {
	first := SeededAccounts()[0]
	for attempt := 1; ; attempt++ {
		d, err := s.store.AggregateDetails(ctx, Key(first.ID))
		if celeriant.IsNotFound(err) && attempt < s.maxRetries {
			if err := s.loop().Backoff.Wait(ctx, attempt+1); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return s.fatal(fmt.Errorf("accounts: checking the server's timestamp precision on %s: %w", first.Name, err))
		}
		if err := s.precision.CheckTimestamp(d.LastServerTimestamp, time.Now()); err != nil {
			return fmt.Errorf("accounts: the server's timestamps do not fit the configured precision %s: %w", s.precision, err)
		}
		return nil
	}
}

// epochMillis converts a server timestamp to Unix epoch milliseconds.
func (s *Service) epochMillis(ts uint64) uint64 {
	return uint64(s.precision.Duration(ts) / time.Millisecond)
}

func (s *Service) seedOne(ctx context.Context, a Account) error {
	if err := s.proj.ensureAccount(ctx, a.ID, a.Name); err != nil {
		return fmt.Errorf("accounts: seeding %s: %w", a.Name, err)
	}
	d, err := s.store.AggregateDetails(ctx, Key(a.ID))
	switch {
	case err == nil && d.MaxVersion > 0:
		return nil
	case err != nil && !celeriant.IsNotFound(err):
		return s.fatal(fmt.Errorf("accounts: seeding %s: %w", a.Name, err))
	}
	_, err = s.store.Write(ctx, celeriant.WriteRequest{
		ClientID: s.clientID,
		Writes: []celeriant.AggregateWrite{{
			Key:             Key(a.ID),
			Events:          []celeriant.Event{{TypeMajor: uint64(Deposited), Value: encodePayload(Deposited, int32(a.SeedBalance), uuid.Nil)}},
			AllowCreate:     true,
			ExpectedVersion: celeriant.Version(0),
		}},
	})
	if err != nil && !celeriant.IsConflict(err) {
		return s.fatal(fmt.Errorf("accounts: seeding %s: %w", a.Name, err))
	}
	return nil
}
