// Package idemgrpc makes unary gRPC methods safe to retry: a server
// interceptor that runs a call at most once per idempotency key and replays its
// answer, over the same stores as the HTTP middleware (package middleware;
// docs/grpc.md).
//
// The client sends the key in the "idempotency-key" metadata. The interceptor
// fingerprints the full method name and the request message (deterministic
// protobuf encoding), claims (scope, key) in a store.Store, runs the handler,
// stores its response message or status, and replays it to every retry, with
// the header metadata "idempotent-replayed: true". One answer per situation, the
// HTTP middleware's decision table in gRPC status codes:
//
//	situation                               HTTP        gRPC
//	key missing (WithKeyRequired)           400         INVALID_ARGUMENT, ErrorInfo idempotency_key_missing
//	key invalid, or refused by the          400         INVALID_ARGUMENT, ErrorInfo idempotency_key_invalid
//	  validator or the store
//	same key, other method or request       422         FAILED_PRECONDITION, ErrorInfo key_reused_with_different_payload
//	same key, lease live (in flight)        409         ABORTED, RetryInfo (the remaining lease, at least 1 s),
//	                                                      ErrorInfo request_in_flight
//	store failed or did not answer          503         UNAVAILABLE, RetryInfo (WithStoreRetryAfter),
//	                                                      ErrorInfo store_unavailable
//	completed                               replay      the stored message, or the stored status (code,
//	                                                      message, details); "idempotent-replayed: true"
//	handler answers a retryable code        release     the status passes through; the next call runs
//	  (see DefaultReleasePolicy), or panics
//
// ErrorInfo and RetryInfo are the google.rpc error details (package
// google.golang.org/genproto/googleapis/rpc/errdetails), with the domain
// "idemkey" and the middleware's problem codes as reasons.
//
// The handler runs on a context that keeps the call's values but not its
// cancellation or deadline, as the HTTP middleware's handler by default: a
// client that gives up does not stop a side effect half way, the answer is
// stored, and the client's retry gets it. The context is cancelled (cause
// store.ErrLeaseLost) when another call took the key over. KeyFromContext
// returns the call's scope and key; the context also carries the claim
// (claim.FromContext, claim.MarkCompleted, claim.SetRetention).
//
// The interceptor runs each call through package idem, which runs it on package
// claim, the one claimed execution the HTTP middleware uses too (claim with a
// bounded call and a lease, renewal, completion retried in the background while
// the lease is held, so a hung store delays the answer by one store timeout at
// most, release); records are idem's, so give gRPC calls scopes of their own,
// apart from the HTTP middleware's.
package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/idem"
	"github.com/idemkey/idemkey/store"
)

// Metadata names (lowercase, as gRPC carries them).
const (
	// KeyMetadata carries the idempotency key, as text.
	KeyMetadata = "idempotency-key"
	// KeyMetadataBin is the binary form a gRPC client may send a key in
	// (the "-bin" suffix). It is refused, INVALID_ARGUMENT
	// idempotency_key_invalid: a key has one text form, and bytes mapped to
	// text would let one key have two spellings; ignoring it would run the
	// call unprotected on every retry.
	KeyMetadataBin = KeyMetadata + "-bin"
	// ReplayedMetadata is set to "true" in the header metadata of a replay.
	ReplayedMetadata = "idempotent-replayed"
)

// Defaults of the options.
const (
	// DefaultLease is the claim's lease (renewed every third of it).
	DefaultLease = idem.DefaultLease
	// DefaultRetention is how long an answer is kept and replayed.
	DefaultRetention = idem.DefaultRetention
	// DefaultStoreTimeout bounds the claim, the completion and the release.
	DefaultStoreTimeout = idem.DefaultStoreTimeout
	// DefaultStoreRetryAfter is the RetryInfo of an UNAVAILABLE answer.
	DefaultStoreRetryAfter = time.Second
	// ErrorDomain is the domain of the ErrorInfo details the interceptor sends.
	ErrorDomain = "idemkey"
)

// ScopeFunc returns the scope of a call (the authenticated principal or tenant
// that owns its keys) from its context, e.g. the peer's certificate or the
// authorization metadata, and its full method name. Two scopes never see each
// other's records.
type ScopeFunc func(ctx context.Context, fullMethod string) string

// GlobalScope puts every key in one scope; choose it explicitly, only when keys
// are unguessable and clients trust each other.
func GlobalScope(context.Context, string) string { return "" }

// Option configures an Interceptor.
type Option func(*config)

type config struct {
	lease, retention, storeTimeout, storeRetryAfter time.Duration
	required                                        bool
	methods                                         map[string]bool
	validate                                        func(key string) error
	release                                         func(codes.Code) bool
	logger                                          *slog.Logger
}

// WithLease sets the claim's lease (default DefaultLease; at least
// idem.MinLease).
func WithLease(d time.Duration) Option { return func(c *config) { c.lease = d } }

// WithRetention sets how long answers are replayed (default DefaultRetention; at
// least the lease).
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// WithStoreTimeout bounds each claim, completion and release (default
// DefaultStoreTimeout; positive). A claim that runs out of time is UNAVAILABLE.
func WithStoreTimeout(d time.Duration) Option { return func(c *config) { c.storeTimeout = d } }

// WithStoreRetryAfter sets the RetryInfo delay of an UNAVAILABLE answer (default
// DefaultStoreRetryAfter; positive).
func WithStoreRetryAfter(d time.Duration) Option { return func(c *config) { c.storeRetryAfter = d } }

// WithKeyRequired(true) answers a protected call without the key
// INVALID_ARGUMENT; by default such a call runs unprotected, nothing stored.
func WithKeyRequired(on bool) Option { return func(c *config) { c.required = on } }

// WithMethods protects only the full methods named ("/pkg.Service/Method");
// calls of other methods pass through and their key is ignored. Default: every
// unary method.
func WithMethods(fullMethods ...string) Option {
	return func(c *config) {
		c.methods = make(map[string]bool, len(fullMethods))
		for _, m := range fullMethods {
			c.methods[m] = true
		}
	}
}

// WithKeyValidator adds a rule on keys (middleware.UUIDKeys is one): a key it
// refuses is answered INVALID_ARGUMENT idempotency_key_invalid with the error's
// text. It runs after the built-in checks, concurrently.
func WithKeyValidator(f func(key string) error) Option { return func(c *config) { c.validate = f } }

// WithReleasePolicy sets which handler status codes release the key instead of
// being stored and replayed (default DefaultReleasePolicy). OK is always stored.
func WithReleasePolicy(release func(codes.Code) bool) Option {
	return func(c *config) { c.release = release }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// DefaultReleasePolicy releases the key for the codes that say "try again" rather
// than "this is the result", the gRPC twins of the statuses the HTTP middleware
// releases (5xx, 408, 409, 429): UNKNOWN, DEADLINE_EXCEEDED, CANCELLED,
// RESOURCE_EXHAUSTED, ABORTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS.
// INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
// FAILED_PRECONDITION, OUT_OF_RANGE and UNAUTHENTICATED are stored and replayed,
// as a 4xx is.
func DefaultReleasePolicy(c codes.Code) bool {
	switch c {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unauthenticated:
		return false
	}
	return c != codes.OK
}

// Interceptor is the idempotency interceptor; build it with New. Safe for
// concurrent use.
type Interceptor struct {
	config
	runner      *idem.Runner
	scope       ScopeFunc
	streamAsked atomic.Bool // Stream was called (Check)
}

// New returns an interceptor claiming keys in st, scoped by scope (required: a
// global scope is chosen explicitly with GlobalScope). Errors: a nil store or
// scope, a lease under idem.MinLease, a retention shorter than the lease, a
// non-positive store timeout or retry delay, a nil release policy.
func New(st store.Store, scope ScopeFunc, opts ...Option) (*Interceptor, error) {
	c := config{lease: DefaultLease, retention: DefaultRetention, storeTimeout: DefaultStoreTimeout,
		storeRetryAfter: DefaultStoreRetryAfter, release: DefaultReleasePolicy}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case st == nil:
		return nil, errors.New("idemkey/grpc: nil store")
	case scope == nil:
		return nil, errors.New("idemkey/grpc: nil scope function (use GlobalScope to share one key space)")
	case c.release == nil:
		return nil, errors.New("idemkey/grpc: nil release policy")
	case c.storeRetryAfter <= 0 || c.storeTimeout <= 0:
		return nil, fmt.Errorf("idemkey/grpc: store timeout %v and retry delay %v must be positive", c.storeTimeout, c.storeRetryAfter)
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	r, err := idem.New(st, idem.WithLease(c.lease), idem.WithRetention(c.retention),
		idem.WithStoreTimeout(c.storeTimeout), idem.WithLogger(c.logger))
	if err != nil {
		return nil, fmt.Errorf("idemkey/grpc: %w", err)
	}
	return &Interceptor{config: c, runner: r, scope: scope}, nil
}

// Wait waits until the store work the interceptor does after its calls returned
// has ended (results stored in the background, claims released in the
// background: idem.Runner.Wait), or ctx is done (then ctx's error). Call it on
// shutdown after grpc.Server.GracefulStop, before closing the store.
func (ic *Interceptor) Wait(ctx context.Context) error { return ic.runner.Wait(ctx) }

type ctxKey struct{}

// KeyFromContext returns the scope and key of the call whose handler context
// ctx is (or derives from); ok is false for a call that runs unprotected.
func KeyFromContext(ctx context.Context) (id store.ID, ok bool) {
	id, ok = ctx.Value(ctxKey{}).(store.ID)
	return id, ok
}

// Unary returns the unary server interceptor, for grpc.UnaryInterceptor or
// grpc.ChainUnaryInterceptor. Request messages must be proto.Message (the
// default codec's); another is answered INTERNAL.
func (ic *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return ic.intercept
}

func (ic *Interceptor) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if ic.methods != nil && !ic.methods[info.FullMethod] {
		return handler(ctx, req)
	}
	key, present, err := ic.key(ctx)
	switch {
	case err != nil:
		return nil, err
	case !present:
		return handler(ctx, req)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemkey/grpc: request of %s is a %T, not a proto.Message", info.FullMethod, req)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemkey/grpc: marshal the request of %s: %v", info.FullMethod, err)
	}
	// Format version 1: a call has no Content-Type to cover (the message is
	// marshalled here), and records stored before version 2 keep matching.
	fp, _ := fingerprint.Sum(fingerprint.Request{Method: "gRPC", Route: info.FullMethod, Body: body}, fingerprint.Options{Version: 1})
	id := store.ID{Scope: ic.scope(ctx, info.FullMethod), Key: key}
	return ic.run(ctx, id, fp, req, handler)
}

// key returns the call's key: present false without one (nil error unless it
// is required), a status error for an invalid one.
func (ic *Interceptor) key(ctx context.Context) (key string, present bool, err error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(KeyMetadata)
	if len(md.Get(KeyMetadataBin)) > 0 {
		return "", false, invalidKey("sent in binary form (" + KeyMetadataBin + "); send it as text in " + KeyMetadata)
	}
	switch {
	case len(vals) == 0 && ic.required:
		return "", false, problem(codes.InvalidArgument, codeKeyMissing,
			"This method requires the "+KeyMetadata+" metadata; send one and retry.", 0)
	case len(vals) == 0:
		return "", false, nil
	case len(vals) > 1:
		return "", false, invalidKey("sent several times")
	}
	key = vals[0]
	if err := checkKey(key); err != nil {
		return "", false, invalidKey(err.Error())
	}
	if ic.validate != nil {
		if err := ic.validate(key); err != nil {
			return "", false, invalidKey(err.Error())
		}
	}
	return key, true, nil
}

// checkKey applies the HTTP middleware's rules to a key: 1 to 255 bytes of
// printable ASCII, not only spaces.
func checkKey(key string) error {
	if len(key) == 0 || len(key) > store.MaxKeyLen {
		return fmt.Errorf("must be 1 to %d bytes, is %d", store.MaxKeyLen, len(key))
	}
	spaces := true
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return errors.New("control or non-ASCII character")
		}
		spaces = spaces && key[i] == ' '
	}
	if spaces {
		return errors.New("only spaces")
	}
	return nil
}

func invalidKey(why string) error {
	return problem(codes.InvalidArgument, codeKeyInvalid, "Invalid "+KeyMetadata+" metadata: "+why+".", 0)
}
