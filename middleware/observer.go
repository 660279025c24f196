package middleware

import (
	"context"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Decision is what the middleware did with one request.
type Decision uint8

// The decisions, one per request. Their String names are stable (metric labels).
const (
	// PassThrough: the method is not protected; the key was ignored.
	PassThrough Decision = iota + 1
	// NoKey: no key on a middleware where it is optional; ran unprotected.
	NoKey
	// KeyMissing: no key where it is required; 400 idempotency_key_missing.
	KeyMissing
	// KeyInvalid: the key is malformed, or the store refused the scope and key as
	// arguments (store.ErrInvalid); 400 idempotency_key_invalid.
	KeyInvalid
	// BodyTooLarge: the request body is over the limit; 413 request_too_large.
	BodyTooLarge
	// BodyUnreadable: reading the request body failed, 400 request_body_unreadable;
	// or the fingerprint rule (FingerprintRule.Body) could not read it, 400
	// request_body_not_json.
	BodyUnreadable
	// Executed: the claim was won, the handler ran and its response was stored.
	Executed
	// Released: the handler ran and the claim was released (release rule,
	// panic, hijack, or an incomplete response: see the package doc), so the
	// next retry runs it again.
	Released
	// LeaseLost: the handler ran but its lease had been taken over; its response
	// was sent to this client but not stored.
	LeaseLost
	// Replayed: a completed record was replayed; the handler did not run.
	Replayed
	// InFlight: another request holds the key; 409 request_in_flight.
	InFlight
	// Mismatch: the key was used for another request; 422
	// key_reused_with_different_payload.
	Mismatch
	// StoreError: the store failed; 503 store_unavailable (fail closed).
	StoreError
	// FailOpen: the store failed and the handler ran unprotected (StoreFailureRule.FailOpen).
	FailOpen
	// StoreFull: the store is up but at its bound and refused to add the key
	// (store.ErrFull, store/memory WithMaxBytes); 503 store_unavailable with
	// Retry-After, even with StoreFailureRule.FailOpen. Not a store outage: nothing is
	// logged above debug level.
	StoreFull
	// ClientGone: the client went away before the store answered the claim
	// (WithCancelOnDisconnect cancelled it): no store failure, no outage; the 503
	// written reaches nobody, and no handler runs.
	ClientGone
)

var decisionNames = [...]string{
	PassThrough: "pass_through", NoKey: "no_key", KeyMissing: "key_missing", KeyInvalid: "key_invalid",
	BodyTooLarge: "body_too_large", BodyUnreadable: "body_unreadable", Executed: "executed",
	Released: "released", LeaseLost: "lease_lost", Replayed: "replayed", InFlight: "in_flight",
	Mismatch: "mismatch", StoreError: "store_error", FailOpen: "fail_open", StoreFull: "store_full",
	ClientGone: "client_gone",
}

// String returns the decision's stable snake_case name, e.g. "replayed".
func (d Decision) String() string {
	if int(d) < len(decisionNames) && decisionNames[d] != "" {
		return decisionNames[d]
	}
	return "unknown"
}

// Event describes one request for an Observer.
type Event struct {
	// Decision is what the middleware did.
	Decision Decision
	// ID is the scope and key; zero for PassThrough, NoKey, KeyMissing, KeyInvalid.
	ID store.ID
	// Status is the status sent to the client (0 if the handler hijacked the
	// connection, 200 if it wrote nothing).
	Status int
	// Takeover is set when the claim took over an expired lease.
	Takeover bool
	// CompletionPending is set on Executed when the attempt to store the response
	// failed (Err says why) while the lease was held: the client got the
	// handler's response at once, and completion is retried in the background,
	// with back-off while the lease is renewed, for at most one lease (package
	// claim). Duplicates get 409 until it succeeds, then the replay; its end is
	// logged (the Event is not sent again).
	CompletionPending bool
	// InTransaction is set on Executed when the handler completed the record in its
	// own transaction (claim.MarkCompleted) and the middleware did not call Complete.
	InTransaction bool
	// StoreLatency is the time spent in store calls on the request's path (claim,
	// then complete or release); renewals are not counted. It includes the claims
	// of a waiting duplicate but not its wait (Waited).
	StoreLatency time.Duration
	// Waited is how long the request waited for the original holder of its key
	// (WithWaitInFlight) before its final claim; 0 when it did not wait.
	Waited time.Duration
	// Err is the store error behind StoreError, FailOpen, StoreFull, a failed
	// completion (Executed, also with CompletionPending) or release (Released: the
	// release then goes on in the background, fenced by the token); nil otherwise.
	Err error
	// CompletedAt is, on Replayed, when the original request's response was
	// stored (store.Record.CompletedAt, on the store's clock); zero otherwise.
	CompletedAt time.Time
}

// Observer is told about every request the middleware sees, once, after the
// response is finished (before a handler's panic is re-raised) and before
// ServeHTTP returns: store work that goes on in the background afterwards (a
// completion retried, a release retried) is not reported again. Attach
// Prometheus or OpenTelemetry here; the core imports neither. Observe must be
// safe for concurrent use and should be fast: it runs on the request's goroutine.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// StoreOp names a store call on a request's path, for a StoreObserver.
type StoreOp uint8

// The store calls a StoreObserver is told about. Their String names are stable
// (span names, metric labels).
const (
	// StoreClaim is store.Store.Claim, once per keyed request.
	StoreClaim StoreOp = iota + 1
	// StoreComplete is store.Store.Complete, after the handler's response.
	StoreComplete
	// StoreRelease is store.Store.Release, after a response that releases the
	// claim (or a panic).
	StoreRelease
	// StoreWait is store.Waiter.Wait, a duplicate waiting for the claim in
	// flight (WithWaitInFlight); each wake-up is followed by one more StoreClaim.
	StoreWait
)

var storeOpNames = [...]string{StoreClaim: "claim", StoreComplete: "complete", StoreRelease: "release", StoreWait: "wait"}

// String returns the op's stable name: "claim", "complete", "release" or "wait".
func (o StoreOp) String() string {
	if int(o) < len(storeOpNames) && storeOpNames[o] != "" {
		return storeOpNames[o]
	}
	return "unknown"
}

// StoreObserver is an optional extension of Observer: an Observer that also
// implements it is called around every store call on a request's path (claim,
// a waiting duplicate's waits and claims again, then complete or release; lease
// renewals, which run off that path, are not reported). StoreCallStart runs just before the call, with the request's
// context (for complete and release, detached from its cancellation); the store
// is called with the context it returns (say, carrying a tracing span), and
// done, if not nil, is called with the call's error as soon as the call
// returns. Both run on the request's goroutine and must be fast. A middleware
// whose observer does not implement it pays nothing for it.
type StoreObserver interface {
	StoreCallStart(ctx context.Context, op StoreOp, id store.ID) (callCtx context.Context, done func(err error))
}
