package idemgrpc_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/idem"
	"github.com/idemkey/idemkey/middleware"
	idemgrpc "github.com/idemkey/idemkey/middleware/grpc"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// TestOnePolicyEveryEntryPoint: one policy.Config value protects an HTTP route,
// a gRPC method and an idem call, and each reads the same decisions from it: the
// key's header (metadata for gRPC) and its validator, the retention every claim
// carries, and the Retry-After of an outage.
func TestOnePolicyEveryEntryPoint(t *testing.T) {
	cfg := policy.Config{
		Key:          policy.KeyRule{Header: "X-Request-Key", Validate: policy.UUIDKeys},
		Lease:        2 * time.Second,
		Retention:    policy.RetentionRule{Default: 3 * time.Hour},
		StoreFailure: policy.StoreFailureRule{RetryAfter: 7 * time.Second},
	}
	const good, bad = "8e03978e-40d5-43e8-bc93-6894a57f9324", "not-a-uuid"
	retention := func(ctx context.Context) time.Duration {
		cl, ok := claim.FromContext(ctx)
		if !ok {
			t.Error("no claim in the handler's context")
		}
		return cl.Retention
	}

	t.Run("http", func(t *testing.T) {
		var calls int
		h := func(st store.Store) http.Handler {
			m, err := middleware.New(st, middleware.GlobalScope, middleware.WithPolicy(cfg), middleware.WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			return m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls++
				if d := retention(r.Context()); d != cfg.Retention.Default {
					t.Errorf("retention %v", d)
				}
				w.WriteHeader(http.StatusCreated)
			}))
		}
		do := func(h http.Handler, key string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/charge", strings.NewReader("x"))
			if key != "" {
				r.Header.Set("X-Request-Key", key)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		ok := h(memory.New())
		if w := do(ok, ""); w.Code != http.StatusBadRequest {
			t.Errorf("no key: %d", w.Code)
		}
		if w := do(ok, bad); w.Code != http.StatusBadRequest {
			t.Errorf("a key the validator refuses: %d", w.Code)
		}
		if w1, w2 := do(ok, good), do(ok, good); w1.Code != 201 || w2.Code != 201 || w2.Header().Get("Idempotent-Replayed") != "true" || calls != 1 {
			t.Errorf("%d, %d (replayed %q) after %d calls", w1.Code, w2.Code, w2.Header().Get("Idempotent-Replayed"), calls)
		}
		if w := do(h(failingStore{memory.New()}), good); w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "7" {
			t.Errorf("outage: %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
		}
	})

	t.Run("grpc", func(t *testing.T) {
		svc := &service{fn: func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			if d := retention(ctx); d != cfg.Retention.Default {
				t.Errorf("retention %v", d)
			}
			return wrapperspb.String("charged " + in.GetValue()), nil
		}}
		ic := func(st store.Store) *idemgrpc.Interceptor {
			ic, err := idemgrpc.New(st, idemgrpc.GlobalScope, idemgrpc.WithPolicy(cfg))
			if err != nil {
				t.Fatal(err)
			}
			return ic
		}
		conn := serve(t, ic(memory.New()), svc)
		invoke := func(key string) (metadata.MD, error) {
			ctx := context.Background()
			if key != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "x-request-key", key)
			}
			var hdr metadata.MD
			err := conn.Invoke(ctx, chargeMethod, wrapperspb.String("x"), new(wrapperspb.StringValue), grpc.Header(&hdr))
			return hdr, err
		}
		_, err := invoke("")
		wantProblem(t, err, codes.InvalidArgument, middleware.CodeKeyMissing)
		_, err = invoke(bad)
		wantProblem(t, err, codes.InvalidArgument, middleware.CodeKeyInvalid)
		if _, err := invoke(good); err != nil {
			t.Fatal(err)
		}
		if hdr, err := invoke(good); err != nil || len(hdr.Get(idemgrpc.ReplayedMetadata)) == 0 || svc.calls.Load() != 1 {
			t.Errorf("repeat: %v %v after %d calls", hdr, err, svc.calls.Load())
		}
		down := serve(t, ic(failingStore{memory.New()}), svc)
		_, _, err = call(metadata.AppendToOutgoingContext(context.Background(), "x-request-key", good), down, chargeMethod, "", "x")
		if retry := wantProblem(t, err, codes.Unavailable, middleware.CodeStoreUnavailable); retry != 7*time.Second {
			t.Errorf("outage RetryInfo %v", retry)
		}
	})

	t.Run("idem", func(t *testing.T) {
		r, err := idem.New(memory.New(), idem.WithPolicy(cfg))
		if err != nil {
			t.Fatal(err)
		}
		calls := 0
		fn := func(ctx context.Context) ([]byte, error) {
			calls++
			if d := retention(ctx); d != cfg.Retention.Default {
				t.Errorf("retention %v", d)
			}
			return []byte("done"), nil
		}
		id := store.ID{Scope: "jobs", Key: good}
		for range 2 {
			if _, err := r.Do(context.Background(), id, idem.Fingerprint([]byte("x")), fn); err != nil {
				t.Fatal(err)
			}
		}
		if calls != 1 {
			t.Fatalf("fn ran %d times", calls)
		}
		bad := cfg
		bad.Lease = time.Millisecond
		if _, err := idem.New(memory.New(), idem.WithPolicy(bad)); err == nil || !strings.Contains(err.Error(), "Lease") {
			t.Fatalf("a lease under the minimum: %v", err)
		}
	})
}
