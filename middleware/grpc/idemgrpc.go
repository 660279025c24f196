// Package idemgrpc makes unary gRPC methods safe to retry: a server
// interceptor that runs a call at most once per idempotency key and replays its
// answer, over the same stores as the HTTP middleware (package middleware;
// docs/grpc.md).
//
// The client sends the key in the "idempotency-key" metadata. The interceptor
// fingerprints the full method name and the request message (deterministic
// protobuf encoding), claims (scope, key) in a store.Store, runs the handler,
// stores its response message or status, and replays it to every retry, with
// the header metadata "idempotent-replayed: true". Each situation of the HTTP
// middleware's decision table (docs/architecture.md section 3) gets its gRPC
// twin, listed in docs/grpc.md section 2: INVALID_ARGUMENT for a missing or
// invalid key, FAILED_PRECONDITION for another request under the key, ABORTED
// with RetryInfo for a call in flight, UNAVAILABLE with RetryInfo when the store
// fails; a retryable code (DefaultRelease) or a panic releases the key.
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
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/idem"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// Metadata names (lowercase, as gRPC carries them).
const (
	// KeyMetadata carries the idempotency key by default, as text:
	// policy.DefaultKeyHeader in lowercase (policy.KeyRule.Header names another).
	KeyMetadata = "idempotency-key"
	// KeyMetadataBin is the binary form of KeyMetadata a gRPC client may send
	// a key in (the "-bin" suffix; with policy.KeyRule.Header, that name plus
	// "-bin"). It is refused, INVALID_ARGUMENT idempotency_key_invalid: a key
	// has one text form, and bytes mapped to text would let one key have two
	// spellings; ignoring it would run the call unprotected on every retry.
	KeyMetadataBin = KeyMetadata + "-bin"
	// ReplayedMetadata is set to "true" in the header metadata of a replay.
	ReplayedMetadata = "idempotent-replayed"
)

// ErrorDomain is the domain of the ErrorInfo details the interceptor sends.
const ErrorDomain = "idemkey"

// ScopeFunc returns the scope of a call (the authenticated principal or tenant
// that owns its keys) from its context, e.g. the peer's certificate or the
// authorization metadata, and its full method name. Two scopes never see each
// other's records.
type ScopeFunc func(ctx context.Context, fullMethod string) string

// GlobalScope puts every key in one scope; choose it explicitly, only when keys
// are unguessable and clients trust each other.
func GlobalScope(context.Context, string) string { return "" }

// Option configures an Interceptor. Each sets one whole decision: a later
// option replaces an earlier one, and a zero value is the documented default.
type Option func(*config)

type config struct {
	pol     policy.Config
	methods map[string]bool
	oneTx   map[string]bool // WithOneTx's methods
	release func(codes.Code) bool
	logger  *slog.Logger

	// Resolved from pol by New.
	keyMD           string
	required        bool
	validate        func(key string) error
	storeRetryAfter time.Duration
}

// WithPolicy sets the shared decisions (policy.Config) that apply to gRPC
// calls: Key (Header names the metadata, lowercased), Lease, Retention,
// StoreFailure.Timeouts and StoreFailure.RetryAfter (the RetryInfo of an
// UNAVAILABLE answer). The interceptor always fails closed and never waits for
// a call in flight: StoreFailure.FailOpen and WaitInFlight are the HTTP
// middleware's, so one Config serves every entry point.
func WithPolicy(p policy.Config) Option { return func(c *config) { c.pol = p } }

// WithKey sets where the key is read and which keys are accepted
// (policy.KeyRule): by default the "idempotency-key" metadata, required
// (a call without it is INVALID_ARGUMENT idempotency_key_missing).
func WithKey(k policy.KeyRule) Option { return func(c *config) { c.pol.Key = k } }

// WithLease sets the claim's lease (policy.Config.Lease).
func WithLease(d time.Duration) Option { return func(c *config) { c.pol.Lease = d } }

// WithRecordRetention sets how long answers are kept and replayed
// (policy.RetentionRule).
func WithRecordRetention(r policy.RetentionRule) Option {
	return func(c *config) { c.pol.Retention = r }
}

// WithStoreFailure sets the store calls' deadlines and the RetryInfo of an
// UNAVAILABLE answer (policy.StoreFailureRule; FailOpen is not read).
func WithStoreFailure(s policy.StoreFailureRule) Option {
	return func(c *config) { c.pol.StoreFailure = s }
}

// WithMethods protects only the full methods named ("/pkg.Service/Method");
// calls of other methods pass through and their key is ignored. No names (the
// default): every unary method.
func WithMethods(fullMethods ...string) Option {
	return func(c *config) {
		c.methods = nil
		for _, m := range fullMethods {
			if c.methods == nil {
				c.methods = make(map[string]bool, len(fullMethods))
			}
			c.methods[m] = true
		}
	}
}

// WithOneTx runs the full methods named ("/pkg.Service/Method") in the
// one-transaction mode (docs/architecture.md section 9.1), as
// middleware.Middleware.OneTx does a route: the claim, every statement the
// handler runs in the transaction the store hands it (store/postgres
// TxFromContext on the handler's context) and the stored answer commit once,
// or not at all (idem.Runner.DoTx). An answer the release rule releases
// rolls the transaction back; when the commit fails (or the handler ended or
// left the transaction itself) the client gets UNAVAILABLE, never the
// handler's success for rows that did not commit. New fails when a method is
// named and the store holds no claim in a transaction (claim.TxStore:
// store/postgres Store.OneTx), or when WithMethods leaves a named method
// unprotected. Other methods keep the default mode. No names: none.
func WithOneTx(fullMethods ...string) Option {
	return func(c *config) {
		c.oneTx = nil
		for _, m := range fullMethods {
			if c.oneTx == nil {
				c.oneTx = make(map[string]bool, len(fullMethods))
			}
			c.oneTx[m] = true
		}
	}
}

// WithRelease sets which handler status codes release the key instead of being
// stored and replayed (nil: DefaultRelease). OK is always stored.
func WithRelease(release func(codes.Code) bool) Option {
	return func(c *config) { c.release = release }
}

// WithLogger sets the logger (nil: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// DefaultRelease releases the key for the codes that say "try again" rather
// than "this is the result", the gRPC twins of the statuses the HTTP middleware
// releases (5xx, 408, 409, 429): UNKNOWN, DEADLINE_EXCEEDED, CANCELLED,
// RESOURCE_EXHAUSTED, ABORTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS.
// INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
// FAILED_PRECONDITION, OUT_OF_RANGE and UNAUTHENTICATED are stored and replayed,
// as a 4xx is.
func DefaultRelease(c codes.Code) bool {
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
// scope, or a policy value out of range (policy.Config.Validate), named.
func New(st store.Store, scope ScopeFunc, opts ...Option) (*Interceptor, error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	switch {
	case st == nil:
		return nil, errors.New("idemkey/middleware/grpc: nil store")
	case scope == nil:
		return nil, errors.New("idemkey/middleware/grpc: nil scope function (use GlobalScope to share one key space)")
	}
	if err := c.pol.Validate(); err != nil {
		return nil, fmt.Errorf("idemkey/middleware/grpc: %w", err)
	}
	p := c.pol.WithDefaults()
	c.keyMD, c.required, c.validate = strings.ToLower(p.Key.Header), !p.Key.Optional, p.Key.Validate
	c.storeRetryAfter = p.StoreFailure.RetryAfter
	if c.release == nil {
		c.release = DefaultRelease
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	r, err := idem.New(st, idem.WithPolicy(c.pol), idem.WithLogger(c.logger))
	if err != nil {
		return nil, fmt.Errorf("idemkey/middleware/grpc: %w", err)
	}
	if err := c.checkOneTx(st, r); err != nil {
		return nil, err
	}
	return &Interceptor{config: c, runner: r, scope: scope}, nil
}

// checkOneTx fails when WithOneTx names a method that cannot run in the
// one-transaction mode: the store holds no claim in a transaction, or
// WithMethods leaves the method unprotected.
func (c *config) checkOneTx(st store.Store, r *idem.Runner) error {
	if len(c.oneTx) > 0 && !r.HoldsTx() {
		return fmt.Errorf("idemkey/middleware/grpc: WithOneTx: the store (%T) holds no claim in a transaction (claim.TxStore; store/postgres Store.OneTx)", st)
	}
	for m := range c.oneTx {
		if c.methods != nil && !c.methods[m] {
			return fmt.Errorf("idemkey/middleware/grpc: WithOneTx names %s, which WithMethods leaves unprotected", m)
		}
	}
	return nil
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
		return nil, status.Errorf(codes.Internal, "idemkey/middleware/grpc: request of %s is a %T, not a proto.Message", info.FullMethod, req)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemkey/middleware/grpc: marshal the request of %s: %v", info.FullMethod, err)
	}
	// Format version 1: a call has no Content-Type to cover (the message is
	// marshalled here), and records stored before version 2 keep matching.
	fp, _ := fingerprint.Sum(fingerprint.Request{Method: "gRPC", Route: info.FullMethod, Body: body}, fingerprint.Options{Version: 1})
	id := store.ID{Scope: ic.scope(ctx, info.FullMethod), Key: key}
	return ic.run(ctx, id, fp, req, handler, ic.oneTx[info.FullMethod])
}

// key returns the call's key: present false without one (nil error unless it
// is required), a status error for an invalid one.
func (ic *Interceptor) key(ctx context.Context) (key string, present bool, err error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(ic.keyMD)
	if len(md.Get(ic.keyMD+"-bin")) > 0 {
		return "", false, ic.invalidKey("sent in binary form (" + ic.keyMD + "-bin); send it as text in " + ic.keyMD)
	}
	switch {
	case len(vals) == 0 && ic.required:
		return "", false, problem(codes.InvalidArgument, codeKeyMissing,
			"This method requires the "+ic.keyMD+" metadata; send one and retry.", 0)
	case len(vals) == 0:
		return "", false, nil
	case len(vals) > 1:
		return "", false, ic.invalidKey("sent several times")
	}
	key = vals[0]
	if err := checkKey(key); err != nil {
		return "", false, ic.invalidKey(err.Error())
	}
	if ic.validate != nil {
		if err := ic.validate(key); err != nil {
			return "", false, ic.invalidKey(err.Error())
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

func (ic *Interceptor) invalidKey(why string) error {
	return problem(codes.InvalidArgument, codeKeyInvalid, "Invalid "+ic.keyMD+" metadata: "+why+".", 0)
}
