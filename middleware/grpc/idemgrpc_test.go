package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	idemgrpc "github.com/idemkey/idemkey/middleware/grpc"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

func newInterceptor(t testing.TB, st store.Store, opts ...idemgrpc.Option) *idemgrpc.Interceptor {
	t.Helper()
	ic, err := idemgrpc.New(st, idemgrpc.GlobalScope, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ic
}

// wantProblem checks err's code and its ErrorInfo reason, and returns its
// RetryInfo delay (0 without one).
func wantProblem(t *testing.T, err error, code codes.Code, reason string) time.Duration {
	t.Helper()
	return wantDetail(t, err, code, idemgrpc.ErrorDomain, reason)
}

func wantDetail(t *testing.T, err error, code codes.Code, domain, reason string) time.Duration {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Fatalf("code %v (%v), want %v", st.Code(), err, code)
	}
	var gotReason string
	var retry time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			gotReason = d.Reason
			if d.Domain != domain {
				t.Errorf("ErrorInfo domain %q", d.Domain)
			}
		case *errdetails.RetryInfo:
			retry = d.RetryDelay.AsDuration()
		}
	}
	if gotReason != reason {
		t.Fatalf("ErrorInfo reason %q, want %q (%v)", gotReason, reason, err)
	}
	return retry
}

func testReplayAndMismatch(t *testing.T, st store.Store) {
	svc := &service{}
	conn := serve(t, newInterceptor(t, st), svc)
	ctx := context.Background()
	key := "k-" + store.NewToken().String()
	got, hdr, err := call(ctx, conn, chargeMethod, key, "5 EUR")
	if err != nil || got != "charged 5 EUR" || len(hdr.Get(idemgrpc.ReplayedMetadata)) != 0 {
		t.Fatalf("first call: %q %v %v", got, hdr, err)
	}
	got, hdr, err = call(ctx, conn, chargeMethod, key, "5 EUR")
	if err != nil || got != "charged 5 EUR" || strings.Join(hdr.Get(idemgrpc.ReplayedMetadata), ",") != "true" {
		t.Fatalf("retry: %q %v %v", got, hdr, err)
	}
	if n := svc.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	_, _, err = call(ctx, conn, chargeMethod, key, "9 EUR")
	wantProblem(t, err, codes.FailedPrecondition, middleware.CodeMismatch)
	_, _, err = call(ctx, conn, readMethod, key, "5 EUR") // another method is another call
	wantProblem(t, err, codes.FailedPrecondition, middleware.CodeMismatch)
	if got, _, err = call(ctx, conn, chargeMethod, key+"-2", "9 EUR"); err != nil || got != "charged 9 EUR" || svc.calls.Load() != 2 {
		t.Fatalf("new key: %q %v, %d calls", got, err, svc.calls.Load())
	}
}

func TestReplayAndMismatch(t *testing.T) { testReplayAndMismatch(t, memory.New()) }

func TestInFlightIsAborted(t *testing.T) {
	entered, proceed := make(chan struct{}), make(chan struct{})
	svc := &service{fn: func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		close(entered)
		<-proceed
		return wrapperspb.String("done"), nil
	}}
	conn := serve(t, newInterceptor(t, memory.New(), idemgrpc.WithLease(30*time.Second), idemgrpc.WithRecordRetention(policy.RetentionRule{Default: time.Hour})), svc)
	first := make(chan error, 1)
	go func() { _, _, err := call(context.Background(), conn, chargeMethod, "k1", "x"); first <- err }()
	<-entered
	_, _, err := call(context.Background(), conn, chargeMethod, "k1", "x")
	retry := wantProblem(t, err, codes.Aborted, middleware.CodeInFlight)
	if retry < time.Second || retry > 30*time.Second {
		t.Errorf("RetryInfo %v, want the remaining lease (at most 30s, at least 1s)", retry)
	}
	close(proceed)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

func TestStoredStatusIsReplayed(t *testing.T) {
	svc := &service{fn: func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		st, _ := status.New(codes.NotFound, "no account "+in.GetValue()).WithDetails(&errdetails.ErrorInfo{Reason: "ACCOUNT", Domain: "bank"})
		return nil, st.Err()
	}}
	conn := serve(t, newInterceptor(t, memory.New()), svc)
	var msgs []string
	for i := range 2 {
		_, hdr, err := call(context.Background(), conn, chargeMethod, "k1", "acc-9")
		if code := wantDetail(t, err, codes.NotFound, "bank", "ACCOUNT"); code != 0 {
			t.Fatalf("RetryInfo %v", code)
		}
		if replayed := len(hdr.Get(idemgrpc.ReplayedMetadata)) > 0; replayed != (i == 1) {
			t.Errorf("call %d: replay header %v", i, hdr)
		}
		msgs = append(msgs, status.Convert(err).Message())
	}
	if msgs[0] != "no account acc-9" || msgs[1] != msgs[0] || svc.calls.Load() != 1 {
		t.Fatalf("messages %q, %d calls", msgs, svc.calls.Load())
	}
}

func TestRetryableStatusReleases(t *testing.T) {
	svc := &service{}
	svc.fn = func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		if svc.calls.Load() == 1 {
			return nil, status.Error(codes.Unavailable, "bank down")
		}
		return wrapperspb.String("ok"), nil
	}
	conn := serve(t, newInterceptor(t, memory.New()), svc)
	if _, _, err := call(context.Background(), conn, chargeMethod, "k1", "x"); status.Code(err) != codes.Unavailable {
		t.Fatalf("first: %v", err)
	}
	got, hdr, err := call(context.Background(), conn, chargeMethod, "k1", "x")
	if err != nil || got != "ok" || len(hdr.Get(idemgrpc.ReplayedMetadata)) != 0 || svc.calls.Load() != 2 {
		t.Fatalf("second: %q %v %v, %d calls", got, hdr, err, svc.calls.Load())
	}
}

func TestKeyMissingAndMethods(t *testing.T) {
	svc := &service{}
	conn := serve(t, newInterceptor(t, memory.New(), idemgrpc.WithKey(policy.KeyRule{Optional: true})), svc)
	for range 2 {
		if _, _, err := call(context.Background(), conn, chargeMethod, "", "x"); err != nil {
			t.Fatal(err)
		}
	}
	if svc.calls.Load() != 2 {
		t.Fatalf("without a key (optional) the call runs every time: %d", svc.calls.Load())
	}
	req := serve(t, newInterceptor(t, memory.New(), idemgrpc.WithMethods(chargeMethod)), svc)
	_, _, err := call(context.Background(), req, chargeMethod, "", "x")
	wantProblem(t, err, codes.InvalidArgument, middleware.CodeKeyMissing)
	for range 2 { // not protected: runs each time, key ignored
		if _, _, err := call(context.Background(), req, readMethod, "k1", "x"); err != nil {
			t.Fatal(err)
		}
	}
	if svc.calls.Load() != 4 {
		t.Fatalf("%d calls, want 4", svc.calls.Load())
	}
}

func TestInvalidKey(t *testing.T) {
	svc := &service{}
	conn := serve(t, newInterceptor(t, memory.New(), idemgrpc.WithKey(policy.KeyRule{Validate: policy.UUIDKeys})), svc)
	for _, key := range []string{strings.Repeat("a", 256), "   ", "not-a-uuid"} {
		_, _, err := call(context.Background(), conn, chargeMethod, key, "x")
		wantProblem(t, err, codes.InvalidArgument, middleware.CodeKeyInvalid)
	}
	_, _, err := call(context.Background(), conn, chargeMethod, "not-a-uuid", "x")
	if !strings.Contains(status.Convert(err).Message(), "UUID") {
		t.Errorf("validator's text missing: %v", err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.KeyMetadata, "8e03978e-40d5-43e8-bc93-6894a57f9324",
		idemgrpc.KeyMetadata, "8e03978e-40d5-43e8-bc93-6894a57f9325")
	_, _, err = call(ctx, conn, chargeMethod, "", "x")
	wantProblem(t, err, codes.InvalidArgument, middleware.CodeKeyInvalid)
	if _, _, err := call(context.Background(), conn, chargeMethod, "8e03978e-40d5-43e8-bc93-6894a57f9324", "x"); err != nil {
		t.Fatal(err)
	}
	if svc.calls.Load() != 1 {
		t.Fatalf("%d calls, want 1", svc.calls.Load())
	}
}

// failingStore answers every claim with an error.
type failingStore struct{ store.Store }

func (failingStore) Claim(context.Context, store.ClaimRequest) (store.ClaimResult, error) {
	return store.ClaimResult{}, errors.New("connection refused")
}

func TestStoreDownIsUnavailable(t *testing.T) {
	svc := &service{}
	conn := serve(t, newInterceptor(t, failingStore{memory.New()}, idemgrpc.WithStoreFailure(policy.StoreFailureRule{RetryAfter: 3 * time.Second})), svc)
	_, _, err := call(context.Background(), conn, chargeMethod, "k1", "x")
	if retry := wantProblem(t, err, codes.Unavailable, middleware.CodeStoreUnavailable); retry != 3*time.Second {
		t.Errorf("RetryInfo %v", retry)
	}
	if svc.calls.Load() != 0 {
		t.Fatal("handler ran without a claim")
	}
}

// completions tells when a record is stored.
type completions struct {
	store.Store
	done chan struct{}
}

func (c completions) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, retention time.Duration) error {
	err := c.Store.Complete(ctx, id, tok, resp, retention)
	c.done <- struct{}{}
	return err
}

// A client that gives up does not cancel the handler: its answer is stored and
// the retry gets it without a second run.
func TestClientGivesUpHandlerFinishes(t *testing.T) {
	entered, proceed := make(chan struct{}), make(chan struct{})
	handlerErr := make(chan error, 1)
	svc := &service{fn: func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		close(entered)
		<-proceed
		handlerErr <- ctx.Err()
		id, ok := idemgrpc.KeyFromContext(ctx)
		if !ok || id.Key != "k1" {
			return nil, status.Error(codes.Internal, "no key in context")
		}
		return wrapperspb.String("charged"), nil
	}}
	st := completions{Store: memory.New(), done: make(chan struct{}, 1)}
	conn := serve(t, newInterceptor(t, st), svc)
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { _, _, err := call(ctx, conn, chargeMethod, "k1", "x"); first <- err }()
	<-entered
	cancel()
	if err := <-first; status.Code(err) != codes.Canceled {
		t.Fatalf("client: %v", err)
	}
	close(proceed)
	if err := <-handlerErr; err != nil {
		t.Fatalf("handler context: %v", err)
	}
	<-st.done
	got, hdr, err := call(context.Background(), conn, chargeMethod, "k1", "x")
	if err != nil || got != "charged" || len(hdr.Get(idemgrpc.ReplayedMetadata)) == 0 || svc.calls.Load() != 1 {
		t.Fatalf("retry: %q %v %v, %d calls", got, hdr, err, svc.calls.Load())
	}
}

func TestNotProtoRequest(t *testing.T) {
	ic := newInterceptor(t, memory.New())
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemgrpc.KeyMetadata, "k1"))
	ran := false
	_, err := ic.Unary()(ctx, struct{}{}, &grpc.UnaryServerInfo{FullMethod: chargeMethod},
		func(context.Context, any) (any, error) { ran = true; return nil, nil })
	if status.Code(err) != codes.Internal || ran {
		t.Fatalf("%v, ran %v", err, ran)
	}
}

func TestNewRefuses(t *testing.T) {
	for name, f := range map[string]func() (*idemgrpc.Interceptor, error){
		"nil store": func() (*idemgrpc.Interceptor, error) { return idemgrpc.New(nil, idemgrpc.GlobalScope) },
		"nil scope": func() (*idemgrpc.Interceptor, error) { return idemgrpc.New(memory.New(), nil) },
		"short lease": func() (*idemgrpc.Interceptor, error) {
			return idemgrpc.New(memory.New(), idemgrpc.GlobalScope, idemgrpc.WithLease(time.Millisecond))
		},
		"retention": func() (*idemgrpc.Interceptor, error) {
			return idemgrpc.New(memory.New(), idemgrpc.GlobalScope, idemgrpc.WithRecordRetention(policy.RetentionRule{Default: time.Second}))
		},
		"store timeout": func() (*idemgrpc.Interceptor, error) {
			return idemgrpc.New(memory.New(), idemgrpc.GlobalScope, idemgrpc.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: -1}}))
		},
		"negative retry wait": func() (*idemgrpc.Interceptor, error) {
			return idemgrpc.New(memory.New(), idemgrpc.GlobalScope, idemgrpc.WithStoreFailure(policy.StoreFailureRule{RetryAfter: -1}))
		},
	} {
		if ic, err := f(); ic != nil || err == nil {
			t.Errorf("%s: %v, %v", name, ic, err)
		}
	}
}

// lostLease refuses every renewal: another holder took the key over.
type lostLease struct {
	store.Store
	completes atomic.Int32
}

func (l *lostLease) Renew(context.Context, store.ID, store.Token, time.Duration) error {
	return store.ErrLeaseLost
}

func (l *lostLease) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	l.completes.Add(1)
	return l.Store.Complete(ctx, id, tok, resp, ret)
}

// When the lease is lost the handler's context is cancelled with cause
// store.ErrLeaseLost; its answer goes to its own client and is not stored.
func TestLeaseLostCancelsHandler(t *testing.T) {
	st := &lostLease{Store: memory.New()}
	cause := make(chan error, 1)
	svc := &service{fn: func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return wrapperspb.String("late"), nil
	}}
	conn := serve(t, newInterceptor(t, st, idemgrpc.WithLease(100*time.Millisecond), idemgrpc.WithRecordRetention(policy.RetentionRule{Default: time.Minute})), svc)
	got, _, err := call(context.Background(), conn, chargeMethod, "k1", "x")
	if err != nil || got != "late" {
		t.Fatalf("%q %v", got, err)
	}
	if c := <-cause; !errors.Is(c, store.ErrLeaseLost) {
		t.Fatalf("cause %v", c)
	}
	if n := st.completes.Load(); n != 0 {
		t.Fatalf("%d completions after the lease was lost", n)
	}
}
