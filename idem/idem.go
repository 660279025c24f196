// Package idem runs plain functions at most once per idempotency key, over the
// same store contract the HTTP middleware uses (docs/architecture.md sections 4
// and 10): a message id, a job id or a business key takes the place of the
// Idempotency-Key header.
//
// Do claims the key with a lease, runs fn, stores the bytes fn returned and
// hands them back on every repeat without running fn again:
//
//	new key                      fn runs; its result is stored          Result{Replayed: false}
//	repeat, same fingerprint     the stored result, fn does not run     Result{Replayed: true}
//	repeat while fn still runs   *InFlightError (errors.Is ErrInFlight), RetryAfter = remaining lease
//	repeat, other fingerprint    *MismatchError (errors.Is ErrMismatch); the record is untouched
//	fn returns an error          released by default (the next call runs fn again);
//	                             a release policy may record it instead: *FailedError on repeats
//	fn panics                    released, then the panic goes on
//	holder died (lease expired)  the next call takes over and runs fn once more
//
// While fn runs the lease is renewed every third of it. If the store reports the
// lease lost (another caller took the key over), fn's context is cancelled with
// cause store.ErrLeaseLost and Do returns an error matching store.ErrLeaseLost:
// fn's result was not stored and the caller must not treat it as the key's.
//
// A Runner writes records with status 200 (fn's result) or 500 (a failure the
// release policy chose to keep, the error's text as body). Give function calls a
// scope of their own: a record the HTTP middleware wrote under the same scope and
// key is reported as corrupt (store.ErrCorrupt), not replayed.
//
// At most once is what the store can promise: a process can die after fn's side
// effect and before the result is stored, and then the next call runs fn again
// once its lease has expired. Side effects that must not repeat carry the key
// themselves (the Postgres inbox of store/postgres, a downstream idempotency key,
// Celeriant's EventId), as docs/architecture.md section 9 describes.
package idem

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Defaults of the options.
const (
	// DefaultLease is how long a claim is exclusive without renewal.
	DefaultLease = 10 * time.Second
	// DefaultRetention is how long a result is replayed after it was stored.
	DefaultRetention = 24 * time.Hour
	// DefaultStoreTimeout bounds each store call that must finish after fn ran
	// (Complete, Release): they run on a context detached from the caller's
	// cancellation, so a caller that gave up still leaves no claim behind.
	DefaultStoreTimeout = 5 * time.Second
	// MinLease is the shortest lease New accepts, the middleware's
	// (middleware.MinLease): the lease is renewed every third of it, and a
	// shorter one would make renewals spin and other callers take over the key
	// of a function that still runs.
	MinLease = 100 * time.Millisecond
)

// Statuses of the records a Runner writes.
const (
	statusResult = 200
	statusFailed = 500
)

// Errors of Do. The typed errors below match them with errors.Is.
var (
	// ErrInFlight: another call holds the key and its lease is live.
	ErrInFlight = errors.New("idemkey/idem: call in flight")
	// ErrMismatch: the key was used with another fingerprint.
	ErrMismatch = errors.New("idemkey/idem: key reused with a different fingerprint")
	// ErrFailed: the key's first call failed and the release policy recorded
	// the failure instead of releasing the key.
	ErrFailed = errors.New("idemkey/idem: recorded failure")
)

// InFlightError is returned when another call holds the key. Retry after
// RetryAfter, the remaining lease on the store's clock (millisecond precision).
type InFlightError struct {
	ID         store.ID
	RetryAfter time.Duration
}

func (e *InFlightError) Error() string {
	return fmt.Sprintf("idemkey/idem: key %q in scope %q is in flight; retry after %v", e.ID.Key, e.ID.Scope, e.RetryAfter)
}

// Is reports whether target is ErrInFlight.
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

// MismatchError is returned when the key was first used with another
// fingerprint. The stored record is left as it was.
type MismatchError struct {
	ID store.ID
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("idemkey/idem: key %q in scope %q was used with a different fingerprint", e.ID.Key, e.ID.Scope)
}

// Is reports whether target is ErrMismatch.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// FailedError is what a repeat gets when the first call's error was recorded
// (the release policy returned false for it). Message is that error's text.
type FailedError struct {
	ID      store.ID
	Message string
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("idemkey/idem: key %q in scope %q failed earlier: %s", e.ID.Key, e.ID.Scope, e.Message)
}

// Is reports whether target is ErrFailed.
func (e *FailedError) Is(target error) bool { return target == ErrFailed }

// Func is the function run once per key. Its result bytes are stored as they
// are (the store's body limit applies) and returned to every repeat; nil and
// empty are both returned as empty. ctx is cancelled with cause
// store.ErrLeaseLost when the claim is lost while fn runs.
type Func func(ctx context.Context) ([]byte, error)

// Result is what Do returns on success.
type Result struct {
	// Value is fn's result bytes: this call's, or the stored ones on a replay.
	// Read-only: it may be the store's copy.
	Value []byte
	// Replayed is set when fn did not run: Value is the stored result.
	Replayed bool
	// Takeover is set when fn ran after taking over a key whose previous holder's
	// lease had expired (the previous call may have run part of fn).
	Takeover bool
}

// Fingerprint returns the SHA-256 digest of a call's arguments, to pass to Do.
// A repeat with other arguments under the same key is then a mismatch.
func Fingerprint(args []byte) store.Fingerprint { return sha256.Sum256(args) }

// Runner runs functions over one store with one configuration. It is safe for
// concurrent use; build it with New.
type Runner struct {
	store        store.Store
	lease        time.Duration
	retention    time.Duration
	storeTimeout time.Duration
	release      func(error) bool
	logger       *slog.Logger
}

// Option configures a Runner.
type Option func(*Runner)

// WithLease sets the claim's lease (default DefaultLease; at least MinLease). It
// is renewed every third of it while fn runs.
func WithLease(d time.Duration) Option { return func(r *Runner) { r.lease = d } }

// WithRetention sets how long a result is kept and replayed (default
// DefaultRetention); at least the lease.
func WithRetention(d time.Duration) Option { return func(r *Runner) { r.retention = d } }

// WithStoreTimeout bounds Complete and Release after fn ran (default
// DefaultStoreTimeout).
func WithStoreTimeout(d time.Duration) Option { return func(r *Runner) { r.storeTimeout = d } }

// WithReleasePolicy decides, for an error fn returned, whether the key is
// released (true: the next call runs fn again) or the failure is recorded and
// returned to repeats as *FailedError (false). Default DefaultReleasePolicy.
func WithReleasePolicy(release func(err error) bool) Option {
	return func(r *Runner) { r.release = release }
}

// WithLogger sets the logger for renewal and store failures after fn ran
// (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(r *Runner) { r.logger = l } }

// DefaultReleasePolicy releases the key on every error: a failed call is retried
// by the next one.
func DefaultReleasePolicy(error) bool { return true }

// New returns a Runner over st. A nil store, a lease under MinLease, a
// non-positive store timeout, a retention shorter than the lease or a nil
// release policy are errors here, never at call time.
func New(st store.Store, opts ...Option) (*Runner, error) {
	r := &Runner{store: st, lease: DefaultLease, retention: DefaultRetention,
		storeTimeout: DefaultStoreTimeout, release: DefaultReleasePolicy}
	for _, o := range opts {
		o(r)
	}
	switch {
	case st == nil:
		return nil, errors.New("idemkey/idem: nil store")
	case r.lease < MinLease:
		return nil, fmt.Errorf("idemkey/idem: lease %v is under the minimum of %v", r.lease, MinLease)
	case r.retention < r.lease:
		return nil, fmt.Errorf("idemkey/idem: retention %v shorter than the lease %v", r.retention, r.lease)
	case r.storeTimeout <= 0:
		return nil, fmt.Errorf("idemkey/idem: store timeout %v must be positive", r.storeTimeout)
	case r.release == nil:
		return nil, errors.New("idemkey/idem: nil release policy")
	}
	if r.logger == nil {
		r.logger = slog.Default()
	}
	return r, nil
}

// Do runs fn at most once for id on st with the default options; see
// Runner.Do.
func Do(ctx context.Context, st store.Store, id store.ID, fp store.Fingerprint, fn Func) (Result, error) {
	r, err := New(st)
	if err != nil {
		return Result{}, err
	}
	return r.Do(ctx, id, fp, fn)
}

// Do claims id with fingerprint fp, runs fn if the claim is granted and stores
// its result; on a repeat it returns the stored result without running fn. The
// package documentation lists every outcome. Errors:
//   - *InFlightError, *MismatchError, *FailedError: the key's state, fn did not run;
//   - fn's own error, unchanged, after the key was released or the failure recorded;
//   - an error matching store.ErrLeaseLost: fn ran (Result.Value holds its result)
//     but another caller took the key over, so the result was not stored;
//   - store.ErrInvalid for a nil fn or an ID the store refuses, store.ErrCorrupt for a record
//     this package did not write, or the store's own error (wrapped) when it
//     could not answer: fn did not run, unless the error came from storing its
//     result (tried 3 times within the lease and the store timeout), in which
//     case Result.Value is set and the key stays claimed until its lease expires.
func (r *Runner) Do(ctx context.Context, id store.ID, fp store.Fingerprint, fn Func) (Result, error) {
	if fn == nil {
		return Result{}, fmt.Errorf("%w: idem: nil fn", store.ErrInvalid)
	}
	res, err := r.store.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fp, Lease: r.lease, Retention: r.retention})
	if err != nil {
		return Result{}, fmt.Errorf("idemkey/idem: claim: %w", err)
	}
	switch res.Outcome {
	case store.Claimed:
	case store.Completed:
		return replay(id, res.Record)
	case store.InFlight:
		return Result{}, &InFlightError{ID: id, RetryAfter: res.RetryAfter}
	case store.Mismatch:
		return Result{}, &MismatchError{ID: id}
	default:
		return Result{}, fmt.Errorf("idemkey/idem: claim: %w: outcome %v", store.ErrCorrupt, res.Outcome)
	}
	return r.run(ctx, id, res, fn)
}

func replay(id store.ID, rec *store.Record) (Result, error) {
	switch {
	case rec == nil:
		return Result{}, fmt.Errorf("idemkey/idem: claim: %w: completed without a record", store.ErrCorrupt)
	case rec.Status == statusResult && !rec.BodyOmitted:
		return Result{Value: rec.Body, Replayed: true}, nil
	case rec.Status == statusFailed && !rec.BodyOmitted:
		return Result{}, &FailedError{ID: id, Message: string(rec.Body)}
	}
	return Result{}, fmt.Errorf("idemkey/idem: %w: key %q in scope %q holds a record this package did not write (status %d)",
		store.ErrCorrupt, id.Key, id.Scope, rec.Status)
}

func (r *Runner) run(ctx context.Context, id store.ID, res store.ClaimResult, fn Func) (out Result, err error) {
	fnCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Renewals and the store calls after fn keep the caller's values but not its
	// cancellation: a caller that gave up still leaves the key in a definite state.
	after := context.WithoutCancel(ctx)
	rn := r.startRenewal(after, id, res.Token, cancel)

	returned := false
	defer func() {
		if returned {
			return
		}
		// fn panicked (or called runtime.Goexit): release, then let it go on.
		rn.stop()
		r.releaseKey(after, id, res.Token)
	}()
	value, fnErr := fn(fnCtx)
	returned = true
	lost := rn.stop()
	out = Result{Value: value, Takeover: res.Takeover}

	if lost { // the key is another caller's now: neither release nor complete it
		err := fmt.Errorf("idemkey/idem: key %q in scope %q taken over while fn ran; result not stored: %w", id.Key, id.Scope, store.ErrLeaseLost)
		if fnErr != nil {
			return Result{Takeover: res.Takeover}, errors.Join(err, fnErr)
		}
		return out, err
	}
	if fnErr != nil {
		if r.release(fnErr) {
			r.releaseKey(after, id, res.Token)
			return Result{Takeover: res.Takeover}, fnErr
		}
		resp := store.Response{Status: statusFailed, Body: []byte(fnErr.Error())}
		if err := r.complete(after, id, res.Token, resp); err != nil {
			return Result{Takeover: res.Takeover}, errors.Join(fnErr, err)
		}
		return Result{Takeover: res.Takeover}, fnErr
	}
	if err := r.complete(after, id, res.Token, store.Response{Status: statusResult, Body: value}); err != nil {
		return out, err
	}
	return out, nil
}

// completeAttempts bounds how often a failed Complete is tried; the retries
// wait completeBackoff, then twice that, and all of them fit in the store
// timeout and in the lease (the claim is still held while they run).
const (
	completeAttempts = 3
	completeBackoff  = 20 * time.Millisecond
)

func (r *Runner) complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response) error {
	ctx, cancel := context.WithTimeout(ctx, min(r.storeTimeout, r.lease))
	defer cancel()
	var err error
	for attempt, wait := 1, completeBackoff; ; attempt, wait = attempt+1, 2*wait {
		err = r.store.Complete(ctx, id, tok, resp, r.retention)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, store.ErrLeaseLost):
			return fmt.Errorf("idemkey/idem: key %q in scope %q taken over while fn ran; result not stored: %w", id.Key, id.Scope, err)
		case errors.Is(err, store.ErrInvalid) || errors.Is(err, store.ErrCorrupt):
			attempt = completeAttempts // the same call fails the same way
		}
		if attempt >= completeAttempts {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		if ctx.Err() != nil {
			break
		}
	}
	r.logger.LogAttrs(ctx, slog.LevelError, "idempotency store failed to store a function's result; the key stays claimed until its lease expires",
		slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
	return fmt.Errorf("idemkey/idem: complete: %w", err)
}

func (r *Runner) releaseKey(ctx context.Context, id store.ID, tok store.Token) {
	ctx, cancel := context.WithTimeout(ctx, r.storeTimeout)
	defer cancel()
	if err := r.store.Release(ctx, id, tok); err != nil && !errors.Is(err, store.ErrLeaseLost) {
		r.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency store failed to release a key; it stays claimed until its lease expires",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
	}
}

// renewal renews the lease every third of it until stopped.
type renewal struct {
	done    chan struct{}
	stopped chan struct{}
	lost    bool // set by the renewal goroutine before it closes stopped
}

func (r *Runner) startRenewal(ctx context.Context, id store.ID, tok store.Token, cancel context.CancelCauseFunc) *renewal {
	rn := &renewal{done: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(rn.stopped)
		t := time.NewTicker(r.lease / 3)
		defer t.Stop()
		for {
			select {
			case <-rn.done:
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, r.storeTimeout)
			err := r.store.Renew(rctx, id, tok, r.lease)
			rcancel()
			switch {
			case errors.Is(err, store.ErrLeaseLost):
				rn.lost = true
				r.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency lease lost while a function runs; its result will not be stored",
					slog.String("scope", id.Scope), slog.String("key", id.Key))
				cancel(store.ErrLeaseLost)
				return
			case err != nil:
				r.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency lease renewal failed; retrying",
					slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", err))
			}
		}
	}()
	return rn
}

// stop ends the renewals, waits for one in progress, and reports whether the
// lease was found lost.
func (rn *renewal) stop() bool {
	select {
	case <-rn.done:
	default:
		close(rn.done)
	}
	<-rn.stopped
	return rn.lost
}
