// Package claim owns one claimed execution, from the store's answer to its end
// (Execution.Run, its one entry point, in the default mode or in a transaction
// that holds the claim, TxStore):
// the claim call itself (bounded), the fencing token it holds, the lease renewal,
// completion with back-off, release, the record completed inside the caller's own
// transaction (MarkCompleted), and the claim carried in the context
// (FromContext). The HTTP middleware (package middleware) and the function
// runner (package idem) both run their executions on it, so one rule holds for
// both (docs/architecture.md section 4):
//
//   - Deadlines: every store call runs under a deadline (Timeouts): the claim,
//     each completion attempt and the release 5 s by default, each renewal a
//     third of the lease, at most 5 s, so one renewal ends before the next is
//     due. Stores that never wait on I/O (store.InProcess) run without one.
//   - Renewal: every third of the lease, dated from when the claim was sent (not
//     when its answer arrived: the store counts the lease from the moment it
//     received the claim, which is after the send), then from each renewal's
//     send: one that fails or runs out of its deadline is retried a third of the
//     lease after it was sent (at once after a full deadline), while the last
//     renewal that reached the store still holds the lease. Renewals go on after
//     the execution returned while its completion is pending, and stop when it
//     ends (a renewal that reaches the store after the record is refused and
//     changes nothing).
//   - Lost lease: when a renewal finds the lease taken over (store.ErrLeaseLost),
//     renewals stop and the execution's context is cancelled with cause
//     store.ErrLeaseLost: another holder runs now, so this one should stop its
//     side effects. Its result is never stored (Complete refuses a stale token).
//   - The caller's answer is not held by the store: after the execution returns
//     (Execution.Run), the caller waits for the completion or the release one
//     answer grace at most (1 s, or the call's own bound when shorter); past it
//     the call goes on in the background, fenced by the token. In the
//     transaction mode (TxStore) the answer waits for the commit, under the
//     completion bound, since it depends on it. Stop does not wait for a renewal
//     in progress.
//   - Completion: a Complete that fails (an error other than ErrLeaseLost,
//     ErrInvalid or ErrCorrupt) is retried in the background, with back-off (20 ms
//     doubling, at most a third of the lease) while the lease is held and
//     renewed, for at most one lease: until then duplicates wait (409), none runs
//     a second time; the outcome is logged. A release that fails is retried in
//     the background too, fenced by the token (release.go).
//   - Release and completion run on a context that keeps the caller's values but
//     not its cancellation: a caller that gave up still leaves the key in a
//     definite state.
//
// What stays with the caller is what only it knows: what the execution's result
// is, whether to release or complete it, and what to tell its client.
package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Defaults shared by the middleware and idem.
const (
	// DefaultLease is how long a claim is exclusive without renewal.
	DefaultLease = 10 * time.Second
	// MinLease is the shortest lease New accepts: the lease is renewed every third
	// of it, and a shorter one would make renewals spin and duplicates take over
	// a live execution's key.
	MinLease = 100 * time.Millisecond
	// DefaultRetention is how long a record is kept and replayed.
	DefaultRetention = 24 * time.Hour
	// DefaultStoreTimeout bounds each Claim, Complete and Release call; Renew's
	// default is a third of the lease, at most this.
	DefaultStoreTimeout = 5 * time.Second
)

// Timeouts bound the store calls. A zero field keeps its default; a call that
// runs out of time is a store error: a claim is reported to the caller (the
// middleware answers 503), a completion is retried in the background while the
// lease is held, a release is retried in the background, a renewal is logged and
// retried.
type Timeouts struct {
	// Claim bounds the claim (default DefaultStoreTimeout).
	Claim time.Duration
	// Complete bounds each attempt to store the result (default
	// DefaultStoreTimeout).
	Complete time.Duration
	// Release bounds the release of a claim (default DefaultStoreTimeout).
	Release time.Duration
	// Renew bounds each lease renewal (default a third of the lease, at most
	// DefaultStoreTimeout), so one renewal ends before the next is due. New
	// refuses one longer than the lease.
	Renew time.Duration
}

// Op names a store call of an execution, for Config.Observe.
type Op uint8

// The store calls reported to Config.Observe (renewals, background releases and
// background completion retries, off the caller's path, are not).
const (
	OpClaim Op = iota + 1
	OpComplete
	OpRelease
)

// Config configures a Claimer. Store, Lease and Retention are required; zero
// timeouts, a nil Clock or Logger take their defaults.
type Config struct {
	// Store is where keys are claimed.
	Store store.Store
	// Lease is the claim's lease (at least MinLease; DefaultLease is the usual).
	Lease time.Duration
	// Retention is how long a completed record is kept (at least the lease;
	// DefaultRetention is the usual).
	Retention time.Duration
	// MaxRetention bounds what SetRetention may give one record (0: Retention;
	// else at least Retention).
	MaxRetention time.Duration
	// Timeouts bound the store calls (zero fields: defaults).
	Timeouts Timeouts
	// Clock schedules renewals and back-offs (default the real clock).
	Clock Clock
	// Logger logs renewal, completion and release failures (default
	// slog.Default()).
	Logger *slog.Logger
	// Observe, if set, is called just before each claim, completion and release
	// call, with the context the call would use; the store is called with the
	// context it returns, and done, if not nil, with the call's error (nil for a
	// call cancelled by the caller's context: no store failure).
	Observe func(ctx context.Context, op Op, id store.ID) (callCtx context.Context, done func(error))
}

// Claimer runs claimed executions over one store with one configuration. Safe
// for concurrent use; build it with New.
type Claimer struct {
	cfg     Config
	bounded bool      // store calls run under deadlines (not store.InProcess)
	epoch   time.Time // origin of Execution.held (monotonic)

	releases releaser   // background releases (release.go)
	work     background // background work, for Wait (background.go)
}

// New returns a Claimer for cfg. It fails on a nil store, a lease under
// MinLease, a retention shorter than the lease, a negative timeout, or a
// renewal timeout longer than the lease.
func New(cfg Config) (*Claimer, error) {
	t := &cfg.Timeouts
	switch {
	case cfg.Store == nil:
		return nil, errors.New("idemkey/claim: nil store")
	case cfg.Lease < MinLease:
		return nil, fmt.Errorf("idemkey/claim: lease %v under the minimum %v (it is renewed every third of it)", cfg.Lease, MinLease)
	case cfg.Retention < cfg.Lease:
		return nil, fmt.Errorf("idemkey/claim: retention %v shorter than the lease %v", cfg.Retention, cfg.Lease)
	case cfg.MaxRetention < 0 || cfg.MaxRetention != 0 && cfg.MaxRetention < cfg.Retention:
		return nil, fmt.Errorf("idemkey/claim: maximum retention %v shorter than the retention %v", cfg.MaxRetention, cfg.Retention)
	case t.Claim < 0 || t.Complete < 0 || t.Release < 0 || t.Renew < 0:
		return nil, fmt.Errorf("idemkey/claim: negative store timeout in %+v", *t)
	case t.Renew > cfg.Lease:
		return nil, fmt.Errorf("idemkey/claim: renewal timeout %v longer than the lease %v (a renewal that slow cannot hold it)", t.Renew, cfg.Lease)
	}
	for _, d := range []*time.Duration{&t.Claim, &t.Complete, &t.Release} {
		if *d == 0 {
			*d = DefaultStoreTimeout
		}
	}
	if t.Renew == 0 {
		t.Renew = min(cfg.Lease/3, DefaultStoreTimeout)
	}
	if cfg.Clock == nil {
		cfg.Clock = RealClock{}
	}
	if cfg.MaxRetention == 0 {
		cfg.MaxRetention = cfg.Retention
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cl := &Claimer{cfg: cfg, epoch: time.Now()}
	if ip, ok := cfg.Store.(store.InProcess); !ok || !ip.InProcess() {
		cl.bounded = true
	}
	return cl, nil
}

// Lease returns the configured lease.
func (cl *Claimer) Lease() time.Duration { return cl.cfg.Lease }

// Retention returns the configured retention.
func (cl *Claimer) Retention() time.Duration { return cl.cfg.Retention }

// Timeouts returns the store call deadlines, defaults filled in.
func (cl *Claimer) Timeouts() Timeouts { return cl.cfg.Timeouts }

// Store returns the store.
func (cl *Claimer) Store() store.Store { return cl.cfg.Store }

// noCancel is the cancel function of an unbounded store call.
func noCancel() {}

// Bound returns parent bounded by d for one store call, unless the store never
// waits on I/O (store.InProcess): then parent itself, with no timer.
func (cl *Claimer) Bound(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if !cl.bounded {
		return parent, noCancel
	}
	return context.WithTimeout(parent, d)
}

func (cl *Claimer) observe(ctx context.Context, op Op, id store.ID) (context.Context, func(error)) {
	if cl.cfg.Observe == nil {
		return ctx, nil
	}
	return cl.cfg.Observe(ctx, op, id)
}

// done reports a call's end to Config.Observe's done. A call cancelled by its
// caller's context (the client went away) is reported as no error: the store did
// not fail.
func done(f func(error), err error) {
	if f != nil {
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		f(err)
	}
}

// Claim sends req (Lease and Retention filled in from the configuration when
// zero: callers set only ID and Fingerprint) under the claim deadline and returns
// the store's answer and when it was sent (on the monotonic clock: the start of
// the lease, for Execution.Start). An answer no store may give (an unknown
// outcome, Completed without a record, Claimed without a token) is returned as an
// error.
//
// The claim's token is generated here, before the send (req.Token, when zero), so
// a claim whose answer is lost (the deadline passed, the connection broke, ctx was
// cancelled) is not left to block its key until the lease ends: it is released,
// fenced by that token, in the background once the store answers again (bounded
// retries with back-off, see release.go).
func (cl *Claimer) Claim(ctx context.Context, req store.ClaimRequest) (res store.ClaimResult, sent time.Time, err error) {
	if req.Lease == 0 {
		req.Lease = cl.cfg.Lease
	}
	if req.Retention == 0 {
		req.Retention = cl.cfg.Retention
	}
	if req.Token.IsZero() {
		req.Token = store.NewToken()
	}
	sent = cl.now()
	cctx, cancel := cl.Bound(ctx, cl.cfg.Timeouts.Claim)
	cctx, d := cl.observe(cctx, OpClaim, req.ID)
	res, err = cl.cfg.Store.Claim(cctx, req)
	cancel()
	done(d, err)
	if mayHaveLanded(err) {
		cl.releaseLater(ctx, req.ID, req.Token)
	}
	if err == nil && (res.Outcome < store.Claimed || res.Outcome > store.Mismatch ||
		res.Outcome == store.Completed && res.Record == nil || res.Outcome == store.Claimed && res.Token.IsZero()) {
		err = fmt.Errorf("%w: idemkey/claim: store answered an invalid claim result (outcome %v)", store.ErrCorrupt, res.Outcome)
	}
	return res, sent, err
}

// now reads only the monotonic clock: a time to subtract, never to show.
func (cl *Claimer) now() time.Time { return cl.epoch.Add(time.Since(cl.epoch)) }

// Clock schedules lease renewals and completion back-offs.
type Clock interface {
	// AfterFunc calls f in its own goroutine after d, like time.AfterFunc.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a scheduled call, like *time.Timer.
type Timer interface {
	// Stop cancels the call; false if it already ran or started.
	Stop() bool
	// Reset schedules the call again after d.
	Reset(d time.Duration) bool
}

// RealClock is the wall clock (time.AfterFunc).
type RealClock struct{}

// AfterFunc is time.AfterFunc.
func (RealClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
