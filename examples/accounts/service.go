package accounts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
)

// Defaults of the write loop (docs/account-service.md section 3).
const (
	// DefaultMaxRetries is the number of write attempts per request.
	DefaultMaxRetries = 3
	// DefaultBackoffBase is the backoff before attempt n (n >= 2): base * 2^(n-1), so
	// 200 ms before attempt 2 and 400 ms before attempt 3.
	DefaultBackoffBase = 100 * time.Millisecond
	// DefaultBackoffJitter is the width of the uniform jitter added to each backoff:
	// [0, 50 ms).
	DefaultBackoffJitter = 50 * time.Millisecond
)

// Service is the account service: deposits, withdrawals and transfers written to
// Celeriant with the idempotent write loop of docs/account-service.md section 3, and reads served by
// a Projection. Every replica of the service shares one client id; run as many Service
// values over one event store as there are replicas. Safe for concurrent use.
type Service struct {
	store    celeriant.EventStore
	proj     Projection
	clientID uuid.UUID

	maxRetries    int
	backoffBase   time.Duration
	backoffJitter time.Duration
	sleep         func(ctx context.Context, d time.Duration) error
	jitter        func(n int64) int64
	log           *slog.Logger
}

// Option configures a Service.
type Option func(*Service)

// WithClientID sets the Celeriant client id the service writes under (default
// ServiceClientID). All replicas must share it: ClientSeq is derived from the stream only
// from batches of this id.
func WithClientID(id uuid.UUID) Option { return func(s *Service) { s.clientID = id } }

// WithMaxRetries sets the number of write attempts per request (default 3, minimum 1).
func WithMaxRetries(n int) Option {
	return func(s *Service) {
		if n >= 1 {
			s.maxRetries = n
		}
	}
}

// WithBackoff sets the backoff before attempt n >= 2: base*2^(n-1) plus a uniform jitter
// in [0, jitter). Defaults 100 ms and 50 ms. Negative values are treated as 0.
func WithBackoff(base, jitter time.Duration) Option {
	return func(s *Service) {
		s.backoffBase, s.backoffJitter = max(base, 0), max(jitter, 0)
	}
}

// WithSleep replaces the backoff sleep (default: a timer that returns ctx.Err() when ctx
// ends first). Tests pass a recorder so no test really sleeps.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(s *Service) {
		if sleep != nil {
			s.sleep = sleep
		}
	}
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(s *Service) {
		if l != nil {
			s.log = l
		}
	}
}

// New returns a service writing to store and reading through proj (a
// *MemoryProjection or a *PostgresProjection). It does not seed; call Seed at startup.
// It fails (a plain error) on a nil store or projection, or a uuid.Nil client id.
func New(store celeriant.EventStore, proj Projection, opts ...Option) (*Service, error) {
	if store == nil || proj == nil {
		return nil, errors.New("accounts: New needs an event store and a projection")
	}
	s := &Service{
		store:         store,
		proj:          proj,
		clientID:      ServiceClientID,
		maxRetries:    DefaultMaxRetries,
		backoffBase:   DefaultBackoffBase,
		backoffJitter: DefaultBackoffJitter,
		sleep:         sleepCtx,
		jitter:        rand.Int64N,
		log:           slog.Default(),
	}
	for _, o := range opts {
		o(s)
	}
	if s.clientID == uuid.Nil {
		return nil, errors.New("accounts: the client id must not be nil")
	}
	return s, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// backoff sleeps before attempt n (n >= 2).
func (s *Service) backoff(ctx context.Context, attempt int) error {
	d := s.backoffBase << (attempt - 1)
	if s.backoffJitter > 0 {
		d += time.Duration(s.jitter(int64(s.backoffJitter)))
	}
	return s.sleep(ctx, d)
}

// Key returns the Celeriant aggregate key of an account.
func Key(acct uuid.UUID) celeriant.AggregateKey {
	return celeriant.AggregateKey{Org: OrgID, Type: AccountTypeID, ID: acct}
}

// Deposit adds amountCents to acct and returns the balance after this request's event and
// the version of its batch. eventID is the request's EventId (EventIDFor; uuid.Nil gets a
// random one). A retry with the same eventID within the window returns the original
// answer and writes nothing. Errors: ErrValidation (amount <= 0), ErrConflict,
// ErrUnavailable, or an internal error.
func (s *Service) Deposit(ctx context.Context, acct uuid.UUID, amountCents int32, eventID uuid.UUID) (Result, error) {
	return s.writeOne(ctx, acct, Deposited, amountCents, eventID)
}

// Withdraw subtracts amountCents from acct, as Deposit; it fails with
// *InsufficientFundsError (ErrInsufficientFunds) when the balance, on the state of the
// attempt, is below the amount.
func (s *Service) Withdraw(ctx context.Context, acct uuid.UUID, amountCents int32, eventID uuid.UUID) (Result, error) {
	return s.writeOne(ctx, acct, Withdrawn, amountCents, eventID)
}

func validateAmount(amount int32) error {
	if amount <= 0 {
		return &ValidationError{Message: "Amount must be positive."}
	}
	return nil
}

// writeOne is the write loop of docs/account-service.md section 3.2 for a one-account event.
func (s *Service) writeOne(ctx context.Context, acct uuid.UUID, typ EventType, amount int32, eventID uuid.UUID) (Result, error) {
	if eventID == uuid.Nil {
		eventID = NewEventID()
	}
	// Attempt 0: also answers "did this request already land?".
	st, hit, ok, err := s.catchUp(ctx, acct, eventID)
	if err != nil || ok {
		return hit, err
	}
	key := Key(acct)
	value := encodePayload(typ, amount, uuid.Nil)
	seq, reDerive := st.MaxClientSeq+1, false
	for attempt := 1; attempt <= s.maxRetries; attempt++ {
		if attempt > 1 {
			if err := s.backoff(ctx, attempt); err != nil {
				return Result{}, err
			}
			// Catch-up and the index check before every retry, then re-derive: this order
			// stops "ambiguous failure, then 2003, then blind re-derive" from writing twice.
			if st, hit, ok, err = s.catchUp(ctx, acct, eventID); err != nil || ok {
				return hit, err
			}
			if reDerive {
				seq, reDerive = st.MaxClientSeq+1, false
			}
		}
		// Business rules on this attempt's fresh state, after the index check: a retry of
		// a landed request gets its original answer even if it would now be refused.
		if err := validateAmount(amount); err != nil {
			return Result{}, err
		}
		newBal := st.BalanceCents + int64(amount)
		if typ == Withdrawn {
			if st.BalanceCents < int64(amount) {
				return Result{}, &InsufficientFundsError{BalanceCents: st.BalanceCents, RequestedCents: int64(amount)}
			}
			newBal = st.BalanceCents - int64(amount)
		}
		_, err := s.store.Write(ctx, celeriant.WriteRequest{
			ClientID: s.clientID,
			Writes: []celeriant.AggregateWrite{{
				Key:                      key,
				Events:                   []celeriant.Event{{ClientSeq: seq, EventID: eventID, TypeMajor: uint64(typ), Value: value}},
				AllowCreate:              true,
				ExpectedVersion:          celeriant.Version(st.Version),
				EnforceClientIdempotency: true,
			}},
		})
		switch arm := classify(err); arm {
		case armSuccess:
			res := Result{BalanceCents: newBal, AggregateVersion: st.Version + 1}
			s.record(ctx, acct, eventID, res, st.Version, seq)
			return res, nil
		case armReDerive:
			reDerive = true
		case armHold:
			s.log.DebugContext(ctx, "accounts: holding ClientSeq", "account", acct, "seq", seq, "attempt", attempt, "err", err)
		case armOwnership:
			v, err := s.whoOwnsSeq(ctx, acct, seq, eventID)
			if err != nil {
				return Result{}, err
			}
			switch v {
			case ours:
				st, hit, ok, err := s.catchUp(ctx, acct, eventID)
				if err != nil || ok {
					return hit, err
				}
				// Landed but not indexed (aged out): the current state, not the original.
				return st.result(), nil
			case sibling:
				reDerive = true
			default:
				return Result{}, &ConflictError{Reason: fmt.Sprintf("state of %s unverifiable after idempotency violation at seq %d; retry the request", acct, seq)}
			}
		default:
			return Result{}, s.fatal(err)
		}
	}
	return Result{}, &ConflictError{Reason: fmt.Sprintf("write to %s did not complete after %d attempts: concurrent updates or timeouts; retry the request", acct, s.maxRetries)}
}

// record runs the projection's recordWrite. A failure is logged and swallowed
// (docs/account-service.md section 4.2): the event is in the log, and the next catch-up replays it.
// It runs even if the caller has gone away meanwhile: the write has landed.
func (s *Service) record(ctx context.Context, acct, eventID uuid.UUID, res Result, expected, seq uint64) {
	if err := s.proj.recordWrite(context.WithoutCancel(ctx), acct, eventID, res, expected, seq); err != nil {
		s.log.WarnContext(ctx, "accounts: recording a write in the projection failed; the next catch-up heals it",
			"account", acct, "event_id", eventID, "version", res.AggregateVersion, "err", err)
	}
}

type arm int

const (
	armSuccess   arm = iota
	armReDerive      // 2003: nothing appended; catch up, fresh seq
	armHold          // ambiguous outcome (incl. 2007) or 2013: hold the seq, fresh version
	armOwnership     // 2002: who owns the seq?
	armFatal         // anything else: propagate
)

// classify maps a write's outcome to its arm (docs/account-service.md section 3.3).
func classify(err error) arm {
	switch {
	case err == nil:
		return armSuccess
	case celeriant.IsConflict(err):
		return armReDerive
	case celeriant.IsOutcomeUnknown(err), celeriant.IsInflightDuplicate(err),
		errors.Is(err, celeriant.CodeWriteReplicationError):
		// 2007 (replication failed, not acknowledged) is an ambiguous outcome too
		// (docs/celeriant-protocol.md section 5); the reference propagates it, holding is safe.
		return armHold
	case celeriant.IsIdempotencyViolation(err):
		return armOwnership
	}
	return armFatal
}

// fatal wraps an error that ends the request. Failures to reach the event store (nothing
// sent, a read without answer, a closed client, server busy or not leader) become
// ErrUnavailable (503); the reference maps only ConnectionFailed there and answers busy
// and not-leader with 500, but all of them are transient and safe to retry.
func (s *Service) fatal(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	if errors.Is(err, celeriant.ErrNotSent) || errors.Is(err, celeriant.ErrTransport) ||
		errors.Is(err, celeriant.ErrClosed) || celeriant.IsBusy(err) || errors.Is(err, celeriant.ErrNotLeader) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// verdict is the answer of whoOwnsSeq.
type verdict int

const (
	unwritten verdict = iota // no event of ours at that seq is visible: never guess (409)
	ours                     // our EventId holds the seq: the write landed
	sibling                  // another request of the service's client id holds it
)

func (v verdict) String() string { return [...]string{"Unwritten", "Ours", "Sibling"}[v] }

// whoOwnsSeq makes the point read of docs/account-service.md section 3.4: the batches of the
// service's client id that hold seq on acct, trimmed to the events with exactly that
// seq. 1001 reads as Unwritten; 1000 (trimmed) re-reads once from the minimum available
// version (the gap docs/account-service.md section 6.1.1 admits).
func (s *Service) whoOwnsSeq(ctx context.Context, acct uuid.UUID, seq uint64, eventID uuid.UUID) (verdict, error) {
	req := celeriant.ReadRequest{Key: Key(acct), Filters: celeriant.ReadFilters{
		FromVersion:     1,
		IncludeClientID: s.clientID,
		MinClientSeq:    celeriant.Uint64(seq),
		MaxClientSeq:    celeriant.Uint64(seq),
	}}
	res, err := s.store.Read(ctx, req)
	if minAvail, ok := celeriant.IsUnavailableVersion(err); ok && minAvail > req.Filters.FromVersion {
		req.Filters.FromVersion = minAvail
		res, err = s.store.Read(ctx, req)
	}
	switch {
	case celeriant.IsNotFound(err):
		return unwritten, nil
	case err != nil:
		return unwritten, s.fatal(fmt.Errorf("accounts: ownership read of %s seq %d: %w", acct, seq, err))
	}
	for _, b := range res.Batches {
		if b.ClientID != s.clientID {
			continue
		}
		for _, ev := range b.Events {
			if ev.ClientSeq == seq {
				if ev.EventID == eventID {
					return ours, nil
				}
				return sibling, nil
			}
		}
	}
	return unwritten, nil
}

// readFrom reads acct's stream from version from to the tip, following pages. A missing
// aggregate (1001) is an empty stream; 1000 (range trimmed) re-reads once from the
// minimum available version.
func (s *Service) readFrom(ctx context.Context, acct uuid.UUID, from uint64) ([]celeriant.Batch, error) {
	req := celeriant.ReadRequest{Key: Key(acct), Filters: celeriant.ReadFilters{FromVersion: max(from, 1)}}
	batches, err := celeriant.ReadAll(ctx, s.store, req)
	if minAvail, ok := celeriant.IsUnavailableVersion(err); ok && minAvail > req.Filters.FromVersion {
		s.log.WarnContext(ctx, "accounts: stream trimmed below the read; reading from the minimum available version",
			"account", acct, "from", req.Filters.FromVersion, "minimum_available", minAvail)
		req.Filters.FromVersion = minAvail
		batches, err = celeriant.ReadAll(ctx, s.store, req)
	}
	switch {
	case celeriant.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, s.fatal(fmt.Errorf("accounts: reading %s from version %d: %w", acct, req.Filters.FromVersion, err))
	}
	return batches, nil
}

// catchUp brings the projection of acct up to the tip of its stream and answers whether
// eventID already landed on it (docs/account-service.md sections 3.5 and 4): the index answers
// first, without reading Celeriant.
func (s *Service) catchUp(ctx context.Context, acct, eventID uuid.UUID) (State, Result, bool, error) {
	st, hit, ok, err := s.proj.lookup(ctx, acct, eventID)
	if err != nil || ok {
		return st, hit, ok, err
	}
	batches, err := s.readFrom(ctx, acct, st.Version+1)
	if err != nil {
		return st, Result{}, false, err
	}
	if len(batches) == 0 {
		return st, Result{}, false, nil
	}
	return s.proj.fold(ctx, acct, st, batches, s.clientID, eventID)
}
