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
//	                             a release rule may record it instead: *FailedError on repeats
//	fn panics                    released, then the panic goes on
//	holder died (lease expired)  the next call takes over and runs fn once more
//
// While fn runs the lease is renewed every third of it. If the store reports the
// lease lost (another caller took the key over), fn's context is cancelled with
// cause store.ErrLeaseLost and Do returns an error matching store.ErrLeaseLost:
// fn's result was not stored and the caller must not treat it as the key's.
//
// A Runner writes records with status 200 (fn's result) or 500 (a failure the
// release rule chose to keep, the error's text as body). Give function calls a
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
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
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
	// ErrFailed: the key's first call failed and the release rule recorded
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
// (the release rule returned false for it). Message is that error's text.
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
	// CompletionPending is set when fn ran but the attempt to store its result
	// failed while the lease was held: Do returned at once (within fn's time
	// plus one store timeout), and the result is stored in the background,
	// retried with back-off while the lease is renewed, for at most one lease
	// (package claim). Repeats get *InFlightError until then, then the stored
	// result; if it never succeeds (logged), the key stays claimed until its
	// lease expires and the next call runs fn again.
	CompletionPending bool
}

// Fingerprint returns the SHA-256 digest of a call's arguments, to pass to Do.
// A repeat with other arguments under the same key is then a mismatch.
func Fingerprint(args []byte) store.Fingerprint { return sha256.Sum256(args) }

// Runner runs functions over one store with one configuration. It is safe for
// concurrent use; build it with New.
type Runner struct {
	claimer      *claim.Claimer
	retention    time.Duration
	storeTimeout time.Duration // each completion attempt's bound
	release      func(error) bool
	logger       *slog.Logger
}

// Option configures a Runner. Each sets one whole decision: a later option
// replaces an earlier one, and a zero value is the documented default.
type Option func(*config)

type config struct {
	pol     policy.Config
	release func(error) bool
	logger  *slog.Logger
	clock   claim.Clock
}

// WithPolicy sets the shared decisions (policy.Config) that apply to functions:
// Lease, Retention and StoreFailure.Timeouts. The other fields are the HTTP
// middleware's and the gRPC interceptor's (a function's key is given, not read;
// Do returns errors instead of answering a client, and never runs fn unprotected
// or waits for a call in flight), so one Config serves every entry point.
func WithPolicy(p policy.Config) Option { return func(c *config) { c.pol = p } }

// WithLease sets the claim's lease (policy.Config.Lease: 0 is claim.DefaultLease,
// else at least claim.MinLease). It is renewed every third of it while fn runs.
func WithLease(d time.Duration) Option { return func(c *config) { c.pol.Lease = d } }

// WithRecordRetention sets how long results are kept and replayed
// (policy.RetentionRule).
func WithRecordRetention(r policy.RetentionRule) Option {
	return func(c *config) { c.pol.Retention = r }
}

// WithStoreFailure sets the store calls' deadlines (policy.StoreFailureRule;
// Timeouts only). The claim runs under the caller's context and its bound;
// completion and release run on a context detached from the caller's
// cancellation, so a caller that gave up still leaves no claim behind.
func WithStoreFailure(s policy.StoreFailureRule) Option {
	return func(c *config) { c.pol.StoreFailure = s }
}

// WithRelease decides, for an error fn returned, whether the key is released
// (true: the next call runs fn again) or the failure is recorded and returned
// to repeats as *FailedError (false). nil: DefaultRelease.
func WithRelease(release func(err error) bool) Option {
	return func(c *config) { c.release = release }
}

// WithClock replaces the clock that schedules renewals and completion back-offs
// (nil: the real one).
func WithClock(clk claim.Clock) Option { return func(c *config) { c.clock = clk } }

// WithLogger sets the logger for renewal and store failures after fn ran (nil:
// slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// DefaultRelease releases the key on every error: a failed call is retried
// by the next one.
func DefaultRelease(error) bool { return true }

// New returns a Runner over st. A nil store, or a policy value out of range
// (policy.Config.Validate: a lease under claim.MinLease, a retention shorter than
// the lease, a negative timeout, ...), is an error here, never at call time.
func New(st store.Store, opts ...Option) (*Runner, error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if st == nil {
		return nil, errors.New("idemkey/idem: nil store")
	}
	if err := c.pol.Validate(); err != nil {
		return nil, fmt.Errorf("idemkey/idem: %w", err)
	}
	p := c.pol.WithDefaults()
	r := &Runner{retention: p.Retention.Default, release: c.release, logger: cmp.Or(c.logger, slog.Default())}
	if r.release == nil {
		r.release = DefaultRelease
	}
	cl, err := claim.New(claim.Config{Store: st, Lease: p.Lease, Retention: p.Retention.Default, MaxRetention: p.Retention.Max,
		Timeouts: p.StoreFailure.Timeouts, Clock: c.clock, Logger: r.logger})
	if err != nil {
		return nil, fmt.Errorf("idemkey/idem: %w", err)
	}
	r.claimer, r.storeTimeout = cl, cl.Timeouts().Complete
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
//     result (the store refused it), in which case Result.Value is set and the
//     key stays claimed until its lease expires. A store that failed to answer
//     the completion in time is no error: Result.CompletionPending is set and
//     the result is stored in the background (package claim).
func (r *Runner) Do(ctx context.Context, id store.ID, fp store.Fingerprint, fn Func) (Result, error) {
	return r.do(ctx, id, fp, fn, false)
}

// DoTx is Do in the one-transaction mode (docs/architecture.md section 9.1): the
// claim, every statement fn runs in the transaction the store hands it
// (store/postgres TxFromContext on fn's context) and the result commit once, or
// not at all. The store must hold claims in transactions (claim.TxStore:
// store/postgres Store.OneTx); otherwise an error wrapping store.ErrInvalid and
// fn does not run. An error fn returns that the release rule releases rolls
// the transaction back. Errors as Do's, and when the commit failed (fn's
// statements did not commit, or may not have) the store's error, wrapping
// claim.ErrTxEnded when fn ended or left the transaction itself.
func (r *Runner) DoTx(ctx context.Context, id store.ID, fp store.Fingerprint, fn Func) (Result, error) {
	return r.do(ctx, id, fp, fn, true)
}

// HoldsTx reports whether r's store holds claims in transactions
// (claim.TxStore), as DoTx needs: a caller that selects the one-transaction mode
// checks it when it is built (middleware/grpc WithOneTx).
func (r *Runner) HoldsTx() bool { return r.claimer.HoldsTx() }

func (r *Runner) do(ctx context.Context, id store.ID, fp store.Fingerprint, fn Func, inTx bool) (Result, error) {
	if fn == nil {
		return Result{}, fmt.Errorf("idemkey/idem: %w: nil fn", store.ErrInvalid)
	}
	var res store.ClaimResult
	var tx claim.Tx
	var sent time.Time
	var err error
	if inTx {
		res, tx, sent, err = r.claimer.ClaimTx(ctx, store.ClaimRequest{ID: id, Fingerprint: fp})
	} else {
		res, sent, err = r.claimer.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fp})
	}
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
	return r.run(ctx, id, res, sent, tx, fn)
}

// Wait waits until the store work r does after Do returned has ended, or ctx is
// done (then ctx's error): results stored in the background
// (Result.CompletionPending, at most a lease each) and claims released in the
// background (claim.Claimer.Wait). Call it on shutdown, once no Do runs, before
// closing the store: a result cut short by the program's exit is not stored,
// and its key stays claimed until the lease ends (then the next call runs fn
// again).
func (r *Runner) Wait(ctx context.Context) error { return r.claimer.Wait(ctx) }

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

func (r *Runner) run(ctx context.Context, id store.ID, res store.ClaimResult, sent time.Time, tx claim.Tx, fn Func) (out Result, err error) {
	fnCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Renewals and the store calls after fn keep the caller's values but not its
	// cancellation: a caller that gave up still leaves the key in a definite state.
	// A lost lease cancels fn's context with cause store.ErrLeaseLost.
	var e claim.Execution
	cl := claim.Claim{ID: id, Token: res.Token, Takeover: res.Takeover, Retention: r.retention, CompleteTimeout: r.storeTimeout}
	var value []byte
	var fnErr error
	end := e.Run(r.claimer, ctx, claim.Claimed{Claim: cl, Sent: sent, Tx: tx}, cancel, func() claim.Outcome {
		value, fnErr = fn(claim.NewContext(fnCtx, cl, &e))
		switch {
		case e.LeaseLost(): // the key is another caller's now: complete refuses, nothing is stored
		case fnErr != nil && r.release(fnErr):
			return claim.Outcome{Release: true}
		case fnErr != nil:
			return claim.Outcome{Response: store.Response{Status: statusFailed, Body: []byte(fnErr.Error())}}
		}
		return claim.Outcome{Response: store.Response{Status: statusResult, Body: value}}
	})
	out = Result{Value: value, Takeover: res.Takeover}
	if fnErr != nil {
		out.Value = nil
	}
	switch {
	case end.InTx: // fn completed the record in its own transaction (claim.MarkCompleted)
		out.Value = value
		return out, fnErr
	case end.Released:
		return out, fnErr
	case e.LeaseLost() || errors.Is(end.Err, store.ErrLeaseLost) && tx == nil:
		err := fmt.Errorf("idemkey/idem: key %q in scope %q taken over while fn ran; result not stored: %w", id.Key, id.Scope, store.ErrLeaseLost)
		if fnErr != nil {
			return out, errors.Join(err, fnErr)
		}
		return out, err
	case end.Pending:
		out.CompletionPending = true
		return out, fnErr
	case end.Err != nil:
		r.logger.LogAttrs(context.Background(), slog.LevelError, "idempotency store refused a function's result; the key stays claimed until its lease expires",
			slog.String("scope", id.Scope), slog.String("key", id.Key), slog.Any("error", end.Err))
		err := fmt.Errorf("idemkey/idem: complete: %w", end.Err)
		if fnErr != nil {
			return out, errors.Join(fnErr, err)
		}
		return out, err
	}
	return out, fnErr
}
