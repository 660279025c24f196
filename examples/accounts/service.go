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
	"github.com/idemkey/idemkey/celeriant/writeloop"
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
	// DefaultLandedLookback is the search depth of a request that may have landed
	// (MayHaveLanded): 24 h, the idempotency middleware's default retention.
	DefaultLandedLookback = 24 * time.Hour
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
	lookback      time.Duration
	precision     celeriant.Precision
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

// mayHaveLandedKey is the context key of MayHaveLanded.
type mayHaveLandedKey struct{}

// MayHaveLanded returns ctx marked so that a write of the service under it first
// searches the stream for its EventId (writeloop.FindEvent, bounded by the landed
// lookback) when the dedup index misses, before deriving a new ClientSeq. Mark a request
// whose earlier run may have written without answering: the idempotency middleware's
// claim was a takeover of an expired lease. It costs two Celeriant round trips on such
// a request, none on others.
func MayHaveLanded(ctx context.Context) context.Context {
	return context.WithValue(ctx, mayHaveLandedKey{}, true)
}

// MarkedMayHaveLanded reports whether ctx carries the MayHaveLanded mark.
func MarkedMayHaveLanded(ctx context.Context) bool {
	v, _ := ctx.Value(mayHaveLandedKey{}).(bool)
	return v
}

func mayHaveLanded(ctx context.Context) bool { return MarkedMayHaveLanded(ctx) }

// WithLandedLookback sets how far back, in server time from the aggregate's newest
// batch, a request that may have landed (MayHaveLanded) searches the stream for its
// EventId (default DefaultLandedLookback, the middleware's default retention). Set it to
// the idempotency middleware's retention. Non-positive values are ignored.
func WithLandedLookback(d time.Duration) Option {
	return func(s *Service) {
		if d > 0 {
			s.lookback = d
		}
	}
}

// WithTimestampPrecision sets the precision of the Celeriant server's batch timestamps
// (its --timestamp-precision; default celeriant.Milliseconds, the server's default).
// Both windows measured in server time, the projection's dedup window and the landed
// lookback, convert through it; the protocol does not carry it, and Seed refuses a
// server whose timestamps do not fit it (celeriant.ErrPrecisionMismatch).
func WithTimestampPrecision(p celeriant.Precision) Option {
	return func(s *Service) { s.precision = p }
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
		jitter:        rand.Int64N,
		lookback:      DefaultLandedLookback,
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

// loop returns the service's write loop settings.
func (s *Service) loop() writeloop.Loop {
	return writeloop.Loop{MaxAttempts: s.maxRetries, Backoff: writeloop.Backoff{
		Base: noWait(s.backoffBase), Jitter: noWait(s.backoffJitter), Rand: s.jitter, Sleep: s.sleep,
	}}
}

// noWait marks a zero backoff setting (the writeloop defaults apply to 0).
func noWait(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// oneAccount is the Attempt of a deposit or withdrawal (docs/account-service.md section 3.2).
type oneAccount struct {
	s       *Service
	acct    uuid.UUID
	typ     EventType
	amount  int32
	eventID uuid.UUID
	landed  bool // the request may have landed beyond the index (a takeover)

	st       State
	caught   bool // st is fresh from the caller's catch-up: the first Prepare uses it
	seq      uint64
	searched bool
	answer   Result // set when Prepare finds the request landed
}

func (a *oneAccount) Prepare(ctx context.Context, _ int, reDerive bool) (bool, error) {
	if !a.caught {
		st, hit, ok, err := a.s.catchUp(ctx, a.acct, a.eventID)
		if err != nil {
			return false, err
		}
		if ok {
			a.answer = hit
			return true, nil
		}
		a.st = st
	}
	a.caught = false
	st := a.st
	if reDerive {
		if a.landed && !a.searched {
			a.searched = true
			res, found, err := a.s.searchLanded(ctx, a.acct, st, a.eventID)
			if err != nil || found {
				a.answer = res
				return found, err
			}
		}
		a.seq = st.MaxClientSeq + 1
	}
	// Business rules on this attempt's fresh state, after the index check: a retry of a
	// landed request gets its original answer even if it would now be refused.
	if err := validateAmount(a.amount); err != nil {
		return false, err
	}
	if a.typ == Withdrawn && st.BalanceCents < int64(a.amount) {
		return false, &InsufficientFundsError{BalanceCents: st.BalanceCents, RequestedCents: int64(a.amount)}
	}
	return false, nil
}

func (a *oneAccount) Write(ctx context.Context) error {
	_, err := a.s.store.Write(ctx, celeriant.WriteRequest{
		ClientID: a.s.clientID,
		Writes: []celeriant.AggregateWrite{{
			Key:                      Key(a.acct),
			Events:                   []celeriant.Event{{ClientSeq: a.seq, EventID: a.eventID, TypeMajor: uint64(a.typ), Value: encodePayload(a.typ, a.amount, uuid.Nil)}},
			AllowCreate:              true,
			ExpectedVersion:          celeriant.Version(a.st.Version),
			EnforceClientIdempotency: true,
		}},
	})
	if writeloop.Classify(err) == writeloop.Hold {
		a.s.log.DebugContext(ctx, "accounts: holding ClientSeq", "account", a.acct, "seq", a.seq, "err", err)
	}
	return err
}

func (a *oneAccount) Owner(ctx context.Context) (writeloop.Verdict, error) {
	v, err := writeloop.WhoOwnsSeq(ctx, a.s.store, Key(a.acct), a.s.clientID, a.seq, a.eventID)
	return v, a.s.fatal(err)
}

// writeOne runs the write loop for a one-account event.
func (s *Service) writeOne(ctx context.Context, acct uuid.UUID, typ EventType, amount int32, eventID uuid.UUID) (Result, error) {
	if eventID == uuid.Nil {
		eventID = NewEventID()
	}
	// The first catch-up runs here, so a retry answered from the index costs no
	// allocation for the loop.
	st, hit, ok, err := s.catchUp(ctx, acct, eventID)
	if err != nil || ok {
		return hit, err
	}
	a := &oneAccount{s: s, acct: acct, typ: typ, amount: amount, eventID: eventID, landed: mayHaveLanded(ctx), st: st, caught: true}
	out, err := s.loop().Run(ctx, a)
	switch {
	case err != nil:
		return Result{}, s.loopError(err, acct.String())
	case out == writeloop.Found:
		return a.answer, nil
	case out == writeloop.Owned:
		st, hit, ok, err := s.catchUp(ctx, acct, eventID)
		if err != nil || ok {
			return hit, err
		}
		// Landed but not indexed (aged out): the current state, not the original.
		return st.result(), nil
	}
	res := Result{BalanceCents: a.st.BalanceCents + int64(amount), AggregateVersion: a.st.Version + 1}
	if typ == Withdrawn {
		res.BalanceCents = a.st.BalanceCents - int64(amount)
	}
	s.record(ctx, acct, eventID, res, a.st.Version, a.seq)
	return res, nil
}

// loopError maps the write loop's own errors to ErrConflict (409) and the rest through
// fatal.
func (s *Service) loopError(err error, what string) error {
	switch {
	case errors.Is(err, writeloop.ErrExhausted):
		return &ConflictError{Reason: fmt.Sprintf("write to %s did not complete: concurrent updates or timeouts; retry the request: %v", what, err)}
	case errors.Is(err, writeloop.ErrUnverifiable):
		return &ConflictError{Reason: fmt.Sprintf("state of %s unverifiable after idempotency violation; retry the request: %v", what, err)}
	}
	return s.fatal(err)
}

// searchLanded looks eventID up in acct's recent history (writeloop.FindEvent over the
// landed lookback, server time) for a request that may have landed beyond the dedup
// index. found: the answer is the balance after that event and its batch's version,
// computed from st (caught up) minus the events after it.
func (s *Service) searchLanded(ctx context.Context, acct uuid.UUID, st State, eventID uuid.UUID) (Result, bool, error) {
	v, found, err := writeloop.FindEvent(ctx, s.store, Key(acct), s.clientID, eventID, s.lookback, s.precision)
	if err != nil || !found {
		return Result{}, false, s.fatal(err)
	}
	res := Result{BalanceCents: st.BalanceCents, AggregateVersion: v}
	if v < st.Version {
		batches, err := s.readFrom(ctx, acct, v+1)
		if err != nil {
			return Result{}, false, err
		}
		for _, b := range batches {
			if b.Version > st.Version {
				break
			}
			for _, ev := range b.Events {
				res.BalanceCents -= delta(ev.TypeMajor, ev.Value)
			}
		}
	}
	s.log.InfoContext(ctx, "accounts: a retry after a takeover found its event in the stream; not writing again",
		"account", acct, "event_id", eventID, "version", v)
	return res, true, nil
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
	return s.proj.fold(ctx, acct, st, batches, s.clientID, eventID, s.precision)
}
