// Package store defines the contract between the idempotency middleware and the
// backends that remember idempotency keys: the claim with a lease and a fencing
// token, completion, release and renewal (docs/architecture.md section 4).
//
// Every backend (store/memory, store/postgres, store/redis, store/tiered) answers
// each transition in one round trip and passes the same conformance suite,
// store/storetest.
//
// The life of a key:
//
//	Claim    -> Claimed(token)                  the caller may run the handler
//	Complete(token, response)                   the response is kept for the retention
//	Release(token)                              the key is forgotten; the next claim runs again
//	Renew(token, lease)                         the holder is still working
//
// A claim that is refused answers, in the same call, why: Completed (with the stored
// record), InFlight (with the remaining lease) or Mismatch (the key was used for a
// request with another fingerprint). Lease deadlines and retention run on the
// store's clock, never the application's (store/dynamodb, whose server has no
// clock in its expressions, is the exception: docs/architecture.md section 3).
package store

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"
)

// Errors returned by stores. Backends wrap them with %w; match with errors.Is.
var (
	// ErrLeaseLost is returned by Complete, Release and Renew when the fencing token
	// no longer owns the key: its lease expired and another claimer took the key
	// over, the key was released, or the record expired. The caller's work must not
	// be recorded.
	ErrLeaseLost = errors.New("idemkey/store: lease lost")

	// ErrCorrupt is returned when a stored record cannot be decoded (written by an
	// incompatible version, or foreign data under the store's key). The middleware
	// treats it as a store failure (503), never as a new key.
	ErrCorrupt = errors.New("idemkey/store: corrupt record")

	// ErrInvalid is returned for arguments a store cannot accept: an empty key, a
	// key over MaxKeyLen or a scope over MaxScopeLen bytes, a non-positive lease or
	// retention, a zero token, a status outside 100-999. Every store answers it for
	// the same arguments, before any I/O, for Claim, Complete, Release and Renew
	// alike (the checks are ID.Validate, ClaimRequest.Validate, ValidateHolder and
	// ValidateResponse).
	ErrInvalid = errors.New("idemkey/store: invalid argument")

	// ErrFull is returned by Claim when the store is at its bound on the bytes
	// it keeps (store/memory WithMaxBytes) and the claim would add a record: the
	// store is up and answers every key it holds, but refuses new ones until
	// records expire or are released. The middleware answers 503 with
	// Retry-After (fail closed, even with fail open) and counts it apart from a
	// store that cannot answer (middleware.StoreFull).
	ErrFull = errors.New("idemkey/store: full")
)

// Limits of an ID, the same for every store (docs/architecture.md section 4).
const (
	// MaxKeyLen is the longest key in bytes, as the middleware accepts it.
	MaxKeyLen = 255
	// MaxScopeLen is the longest scope in bytes. A scope is a principal or tenant
	// name, never a payload; the limit keeps scope and key together well inside
	// what every backend can index (Postgres's btree entries are about 2.7 kB).
	MaxScopeLen = 1024
)

// ID names one idempotency key within its scope. Two scopes never share a record.
type ID struct {
	// Scope is the principal or tenant that owns the key (authenticated user, API
	// client). Any bytes, at most MaxScopeLen; the empty string is a valid scope
	// ("global").
	Scope string
	// Key is the Idempotency-Key value as parsed by the middleware. Non-empty,
	// at most MaxKeyLen (255) bytes.
	Key string
}

// Validate checks the limits of id that every store enforces: a non-empty key of
// at most MaxKeyLen bytes and a scope of at most MaxScopeLen bytes. The error
// wraps ErrInvalid and names the part that is wrong.
func (id ID) Validate() error {
	switch {
	case id.Key == "":
		return errorf("empty key")
	case len(id.Key) > MaxKeyLen:
		return errorf("key is %d bytes, over the limit of %d", len(id.Key), MaxKeyLen)
	case len(id.Scope) > MaxScopeLen:
		return errorf("scope is %d bytes, over the limit of %d", len(id.Scope), MaxScopeLen)
	}
	return nil
}

// ValidateHolder checks the arguments of Complete, Release and Renew that name
// the holder: id (see ID.Validate) and a non-zero token. Backends call it first
// and return its error unchanged (it wraps ErrInvalid): the zero token or an
// empty key is a caller's mistake, never ErrLeaseLost.
func ValidateHolder(id ID, token Token) error {
	if err := id.Validate(); err != nil {
		return err
	}
	if token.IsZero() {
		return errorf("zero token")
	}
	return nil
}

// ValidateLease checks the lease of a Renew (wraps ErrInvalid).
func ValidateLease(lease time.Duration) error {
	if lease <= 0 {
		return errorf("lease must be positive")
	}
	return nil
}

// Fingerprint is the SHA-256 digest of the request a key was first used for
// (see package fingerprint). A key reused with another fingerprint is a Mismatch.
type Fingerprint [32]byte

// String returns the fingerprint as 64 lowercase hex digits.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// Token is the fencing token a successful claim hands out. Complete, Release and
// Renew succeed only with the token of the current holder, so a holder whose lease
// expired and was taken over can no longer write. Tokens are 128 random bits; the
// zero Token is never issued.
type Token [16]byte

// NewToken returns a fresh random token. Backends that generate tokens on the
// server may ignore it.
func NewToken() Token {
	var t Token
	for t.IsZero() {
		binary.LittleEndian.PutUint64(t[:8], rand.Uint64()) // one store each
		binary.LittleEndian.PutUint64(t[8:], rand.Uint64())
	}
	return t
}

// IsZero reports whether t is the zero token, which no claim returns.
func (t Token) IsZero() bool { return t == Token{} }

// String returns the token as 32 lowercase hex digits.
func (t Token) String() string { return hex.EncodeToString(t[:]) }

// Response is what the middleware asks a store to keep after the handler ran.
type Response struct {
	// Status is the HTTP status code, 100-999.
	Status int
	// Header holds only the replayable headers (the middleware filters them);
	// canonical names. May be nil.
	Header http.Header
	// Body is the exact response body. Nil or empty when the body was empty or
	// BodyOmitted is set.
	Body []byte
	// BodyOmitted is set when the body was larger than the storage cap: the record
	// is complete but a replay carries status and headers only.
	BodyOmitted bool
}

// Record is a completed idempotency record as a store returns it.
type Record struct {
	// Fingerprint of the request that created the record.
	Fingerprint Fingerprint
	// Response holds the stored status, headers and body (or the omitted mark).
	Response
	// CreatedAt is when the key was first claimed, on the store's clock
	// (store/redis: the claiming process's clock).
	CreatedAt time.Time
	// CompletedAt is when Complete stored the response, on the store's clock
	// (store/redis: the completing process's clock).
	CompletedAt time.Time
	// ExpiresAt is when the record stops being replayed (CompletedAt + retention),
	// on the store's clock (store/redis: as CompletedAt; the key's TTL on the
	// server's clock is what ends it). After it the key is new again.
	ExpiresAt time.Time
}

// ClaimRequest asks a store to claim ID for one execution.
type ClaimRequest struct {
	ID
	// Fingerprint of the request being claimed for.
	Fingerprint Fingerprint
	// Lease is how long the claim is exclusive without renewal. Positive. Stores
	// on a server keep whole milliseconds, rounded up (a positive duration never
	// becomes 0, and a lease is never shorter than asked); so do retentions.
	Lease time.Duration
	// Retention is how long the record (in flight or completed) lives before the
	// key becomes new again. Positive, and at least Lease.
	Retention time.Duration
	// Token is the fencing token the claim holds if it is Claimed (ClaimResult.Token
	// is then this token). The caller generates it (NewToken) before the send, so a
	// claim whose answer was lost (a timeout) can still be released, fenced by it,
	// once the store answers again (package claim does). Zero: the store generates
	// one.
	Token Token
}

// ClaimToken returns the token a claim of r holds: r.Token, or a new one when it
// is zero. Backends call it once per Claim.
func (r ClaimRequest) ClaimToken() Token {
	if r.Token.IsZero() {
		return NewToken()
	}
	return r.Token
}

// Outcome is the answer to a claim.
type Outcome uint8

// The four answers a claim can give; exactly one per call.
const (
	// Claimed: the key was new, released, or its previous holder's lease expired
	// (takeover). The caller holds ClaimResult.Token and must Complete or Release.
	Claimed Outcome = iota + 1
	// Completed: the key has a stored response with the same fingerprint;
	// ClaimResult.Record holds it.
	Completed
	// InFlight: another holder's lease is live and the fingerprint matches;
	// ClaimResult.RetryAfter is the remaining lease.
	InFlight
	// Mismatch: the key is held or completed for a request with another
	// fingerprint. The stored record is left untouched.
	Mismatch
)

// String returns the outcome's lowercase name ("claimed", "completed", ...).
func (o Outcome) String() string {
	switch o {
	case Claimed:
		return "claimed"
	case Completed:
		return "completed"
	case InFlight:
		return "in_flight"
	case Mismatch:
		return "mismatch"
	}
	return "unknown"
}

// ClaimResult is the single answer of Store.Claim.
type ClaimResult struct {
	// Outcome says which of the four answers this is; it decides which of the
	// other fields are set.
	Outcome Outcome
	// Token is the fencing token; set only for Claimed.
	Token Token
	// Takeover is set when Claimed took over a record whose holder's lease had
	// expired (the handler runs once more).
	Takeover bool
	// Record is the stored response; set only for Completed.
	Record *Record
	// RetryAfter is the remaining lease of the current holder; set only for
	// InFlight. Non-negative, millisecond precision.
	RetryAfter time.Duration
}

// Store is an idempotency-record backend. Implementations are safe for concurrent
// use and answer each call in one round trip to their server. A Record a store
// returns is read-only for the caller and is never changed by the store after it
// is returned.
//
// Errors other than ErrLeaseLost (connection loss, timeouts, cancellation,
// ErrCorrupt) mean the store could not answer; the middleware then fails closed
// with 503.
type Store interface {
	// Claim claims req.ID for one execution, or says why not (see Outcome).
	// An expired lease of an uncompleted record is taken over only when the
	// fingerprint matches. Records past their retention are treated as absent.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)

	// Complete stores resp for id if token still owns it, and keeps the record for
	// retention from now (store clock). A record token already completed with
	// resp's status, body and omitted mark answers nil, left as it is (a
	// completion retried after its reply was lost). ErrLeaseLost otherwise. The
	// caller may reuse resp.Body and resp.Header once Complete returns: a store
	// copies what it keeps.
	Complete(ctx context.Context, id ID, token Token, resp Response, retention time.Duration) error

	// Release forgets id if token still owns it, so the next claim runs the handler
	// again. ErrLeaseLost otherwise.
	Release(ctx context.Context, id ID, token Token) error

	// Renew extends the lease of id to lease from now (store clock) if token still
	// owns it and the record is not completed. ErrLeaseLost otherwise.
	Renew(ctx context.Context, id ID, token Token, lease time.Duration) error
}

// CompletionNotifier is an optional interface of stores that keep a copy of records
// in front of an authoritative store (store/tiered). When a handler completed a
// record in its own transaction on the authoritative store (store/postgres
// CompleteTx) and committed, the middleware calls NotifyCompleted with the claim's
// token and the committed response, so the copy can learn of it. Best effort: it
// reports nothing, and never makes the record authoritative; resp must not be
// kept past the call (a store copies what it keeps).
type CompletionNotifier interface {
	NotifyCompleted(ctx context.Context, id ID, token Token, resp Response, retention time.Duration)
}

// InProcess is an optional interface of stores whose calls never wait on I/O
// (store/memory). The middleware puts no deadline on their calls, saving the
// timer; every other store's calls run under the middleware's store timeouts.
type InProcess interface {
	// InProcess reports whether the store answers without I/O.
	InProcess() bool
}

// Validate checks the arguments every store requires of a claim: the ID (see
// ID.Validate), a positive lease and a retention of at least the lease. Backends
// call it first and return its error unchanged (it wraps ErrInvalid).
func (r ClaimRequest) Validate() error {
	if err := r.ID.Validate(); err != nil {
		return err
	}
	switch {
	case r.Lease <= 0:
		return errorf("lease must be positive")
	case r.Retention < r.Lease:
		return errorf("retention must be at least the lease")
	}
	return nil
}

// ValidateResponse checks a response before a store keeps it (wraps ErrInvalid).
func ValidateResponse(resp Response, retention time.Duration) error {
	switch {
	case resp.Status < 100 || resp.Status > 999:
		return errorf("status %d outside 100-999", resp.Status)
	case retention <= 0:
		return errorf("retention must be positive")
	case resp.BodyOmitted && len(resp.Body) > 0:
		return errorf("body given although marked omitted")
	}
	return nil
}

// ValidateRecord checks a completed record a cache is asked to keep for ttl
// (the Fill of store/tiered's Cache): id (see ID.Validate), a non-nil record,
// and its response and ttl (see ValidateResponse). The error wraps ErrInvalid.
func ValidateRecord(id ID, rec *Record, ttl time.Duration) error {
	if err := id.Validate(); err != nil {
		return err
	}
	if rec == nil {
		return errorf("nil record")
	}
	return ValidateResponse(rec.Response, ttl)
}

func errorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// Waiter is an optional interface of stores that can tell a caller when a claim
// in flight ends, so a duplicate request can wait for the original's answer
// instead of being answered 409 at once (middleware.WithWaitInFlight;
// docs/architecture.md sections 3 and 4). store/memory, store/postgres,
// store/redis and store/tiered (through its backstop) implement it.
//
// Wait blocks until id's claim may have ended: the holder completed or released
// it (or an operator evicted it, store.Inspector). It first registers for the notification and then checks, so an end that
// happens between the caller's Claim and the call is never missed; when id holds
// no live claim at the check (absent, completed, lease expired) it returns nil at
// once. A nil return is a hint to claim again, and only that Claim tells the
// answer; it may be spurious (a reconnect, a claim that ended and was claimed
// anew), but while id's claim stays in flight untouched Wait blocks until ctx
// ends. A lease that runs out without completion or release is
// not reported: the caller bounds ctx by the remaining lease
// (ClaimResult.RetryAfter) and claims again (a takeover).
//
// Wait returns ctx.Err() when ctx ends first, an error wrapping
// errors.ErrUnsupported when the store cannot wait in its configuration (the
// caller then polls with back-off), and other errors (the driver's, wrapped)
// when the store cannot watch now; the caller then answers as if it had not
// waited. Wait never changes the outcome of any claim and holds nothing once it
// returns: no goroutine, subscription or connection is left per call.
type Waiter interface {
	Wait(ctx context.Context, id ID) error
}
