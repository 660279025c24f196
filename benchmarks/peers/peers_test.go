package peers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	fiber2 "github.com/gofiber/fiber/v2"
	idem2 "github.com/gofiber/fiber/v2/middleware/idempotency"
	fiber3 "github.com/gofiber/fiber/v3"
	idem3 "github.com/gofiber/fiber/v3/middleware/idempotency"
	"github.com/valyala/fasthttp"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/internal/cputime"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// jsonBody returns a JSON request body of n bytes (n >= 80).
func jsonBody(n int) []byte {
	b := []byte(`{"fromAccountId":"acc-1","toAccountId":"acc-2","amountCents":1234,"memo":"`)
	b = append(b, strings.Repeat("m", n-len(b)-2)...)
	return append(b, `"}`...)
}

// body is the request body of the run: 1 KiB, or the size -peers.body names (a
// typical payment request is about 128 bytes).
var (
	bodySize = flag.Int("peers.body", 1024, "request body size in bytes")
	body     []byte
	answer   = []byte(`{"balanceCents":98766,"aggregateVersion":42}`)
)

func TestMain(m *testing.M) {
	flag.Parse()
	body = jsonBody(max(*bodySize, 80))
	os.Exit(m.Run())
}

// keys are 36 bytes long, the only length Fiber's default validation accepts.
func keys(n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = fmt.Sprintf("%036d", i)
	}
	return k
}

const lifetime = 24 * time.Hour

// A runner serves one request with key and reports the status it answered.
type runner interface {
	serve(key string) int
}

// calls counts handler executions, so a benchmark checks that a first execution
// ran the handler and a replay did not (Fiber marks no replay in its response).
var calls int

// bench runs the three paths of one framework: bare (the handler alone), first
// (a new key every request) and replay (one key, completed before the loop).
func bench(b *testing.B, bare, protected func() runner) {
	b.Run("bare", func(b *testing.B) {
		r := bare()
		b.ReportAllocs()
		stop := cputime.PerOp(b)
		for b.Loop() {
			r.serve("k")
		}
		stop()
	})
	b.Run("first", func(b *testing.B) {
		r := protected()
		ks := keys(b.N + 1)
		b.ReportAllocs()
		b.ResetTimer()
		before := calls
		stop := cputime.PerOp(b)
		for i := 0; i < b.N; i++ {
			if code := r.serve(ks[i]); code != http.StatusCreated {
				b.Fatalf("status %d", code)
			}
		}
		stop()
		if calls-before != b.N {
			b.Fatalf("%d handler runs for %d new keys", calls-before, b.N)
		}
	})
	b.Run("replay", func(b *testing.B) {
		r := protected()
		key := keys(1)[0]
		r.serve(key)
		before := calls
		b.ReportAllocs()
		stop := cputime.PerOp(b)
		for b.Loop() {
			if code := r.serve(key); code != http.StatusCreated {
				b.Fatalf("status %d", code)
			}
		}
		stop()
		if calls != before {
			b.Fatalf("%d handler runs on replays", calls-before)
		}
	})
}

func BenchmarkIdemkey(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(answer)
	})
	bench(b, func() runner { return newNetHTTP(handler) }, func() runner {
		// "first" keeps every key of a run: a bound far above it (the default
		// 64 MiB fills in a long run), still checked on every new key.
		m, err := middleware.New(memory.New(memory.WithMaxBytes(1<<40)), middleware.ScopeFromHeader("X-Client-ID", "anonymous"),
			middleware.WithRecordRetention(policy.RetentionRule{Default: lifetime}), middleware.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			b.Fatal(err)
		}
		return newNetHTTP(m.Handler(handler))
	})
}

func BenchmarkFiberV2(b *testing.B) {
	app := func(use bool) runner {
		app := fiber2.New()
		if use {
			app.Use(idem2.New(idem2.Config{KeyHeader: "Idempotency-Key", Lifetime: lifetime}))
		}
		app.Post("/api/transfers", func(c *fiber2.Ctx) error {
			calls++
			_ = c.Body()
			c.Set(fiber2.HeaderContentType, fiber2.MIMEApplicationJSON)
			return c.Status(http.StatusCreated).Send(answer)
		})
		return newFast(app.Handler())
	}
	bench(b, func() runner { return app(false) }, func() runner { return app(true) })
}

func BenchmarkFiberV3(b *testing.B) {
	app := func(use bool) runner {
		app := fiber3.New()
		if use {
			app.Use(idem3.New(idem3.Config{KeyHeader: "Idempotency-Key", Lifetime: lifetime}))
		}
		app.Post("/api/transfers", func(c fiber3.Ctx) error {
			calls++
			_ = c.Body()
			c.Set(fiber3.HeaderContentType, fiber3.MIMEApplicationJSON)
			return c.Status(http.StatusCreated).Send(answer)
		})
		return newFast(app.Handler())
	}
	bench(b, func() runner { return app(false) }, func() runner { return app(true) })
}

// BenchmarkHash is the part of a first execution and of a replay that no peer
// pays: the request's fingerprint (SHA-256 over method, route, query and body),
// and SHA-256 of the body alone.
func BenchmarkHash(b *testing.B) {
	b.Run("fingerprint", func(b *testing.B) {
		req := fingerprint.Request{Method: http.MethodPost, Route: "/api/transfers", Body: body}
		b.ReportAllocs()
		stop := cputime.PerOp(b)
		for b.Loop() {
			fingerprint.Sum(req, fingerprint.Options{})
		}
		stop()
	})
	b.Run("sha256", func(b *testing.B) {
		b.ReportAllocs()
		stop := cputime.PerOp(b)
		for b.Loop() {
			sha256.Sum256(body)
		}
		stop()
	})
}

// BenchmarkParts splits our added cost (BenchmarkIdemkey's protected minus bare)
// in the same run: store is the memory store's own calls on the middleware's
// path (first: Claim of a new key and Complete with the handler's response, the
// store growing as in BenchmarkIdemkey/first; replay: Claim of a completed key),
// nullstore the middleware over a store that costs nothing (fingerprint, capture,
// the rest). BenchmarkHash gives the fingerprint's share.
func BenchmarkParts(b *testing.B) {
	ctx := context.Background()
	fp, _ := fingerprint.Sum(fingerprint.Request{Method: http.MethodPost, Route: "/api/transfers", Body: body}, fingerprint.Options{})
	resp := store.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: answer}
	claim := func(s *memory.Store, key string) store.ClaimResult {
		res, err := s.Claim(ctx, store.ClaimRequest{ID: store.ID{Scope: "tenant-1", Key: key}, Fingerprint: fp,
			Lease: claim.DefaultLease, Retention: lifetime})
		if err != nil {
			b.Fatal(err)
		}
		return res
	}
	b.Run("store/first", func(b *testing.B) {
		s := memory.New(memory.WithMaxBytes(1 << 40)) // keeps every record, as BenchmarkIdemkey/first
		ks := keys(b.N)
		b.ReportAllocs()
		b.ResetTimer()
		stop := cputime.PerOp(b)
		for i := 0; i < b.N; i++ {
			res := claim(s, ks[i])
			if err := s.Complete(ctx, store.ID{Scope: "tenant-1", Key: ks[i]}, res.Token, resp, lifetime); err != nil {
				b.Fatal(err)
			}
		}
		stop()
	})
	b.Run("store/replay", func(b *testing.B) {
		s := memory.New()
		key := keys(1)[0]
		res := claim(s, key)
		if err := s.Complete(ctx, store.ID{Scope: "tenant-1", Key: key}, res.Token, resp, lifetime); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		stop := cputime.PerOp(b)
		for b.Loop() {
			if claim(s, key).Outcome != store.Completed {
				b.Fatal("not replayed")
			}
		}
		stop()
	})
	b.Run("nullstore/first", func(b *testing.B) {
		m, err := middleware.New(nullStore{}, middleware.ScopeFromHeader("X-Client-ID", "anonymous"),
			middleware.WithRecordRetention(policy.RetentionRule{Default: lifetime}), middleware.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			b.Fatal(err)
		}
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Write(answer)
		})
		r := newNetHTTP(m.Handler(handler))
		key := keys(1)[0]
		b.ReportAllocs()
		stop := cputime.PerOp(b)
		for b.Loop() {
			if code := r.serve(key); code != http.StatusCreated {
				b.Fatalf("status %d", code)
			}
		}
		stop()
	})
}

// nullStore claims every key and keeps nothing: the middleware's cost without a
// store's.
type nullStore struct{}

func (nullStore) Claim(context.Context, store.ClaimRequest) (store.ClaimResult, error) {
	return store.ClaimResult{Outcome: store.Claimed, Token: store.Token{1}}, nil
}
func (nullStore) Complete(context.Context, store.ID, store.Token, store.Response, time.Duration) error {
	return nil
}
func (nullStore) Release(context.Context, store.ID, store.Token) error              { return nil }
func (nullStore) Renew(context.Context, store.ID, store.Token, time.Duration) error { return nil }
func (nullStore) InProcess() bool                                                   { return true }

// netHTTP serves through an http.Handler with a reused request and a writer that
// keeps nothing.
type netHTTP struct {
	h    http.Handler
	r    *http.Request
	body bytes.Reader
	w    discard
}

func newNetHTTP(h http.Handler) *netHTTP {
	n := &netHTTP{h: h, w: discard{h: http.Header{}}}
	n.r, _ = http.NewRequest(http.MethodPost, "http://svc/api/transfers", nil)
	n.r.Header.Set("Content-Type", "application/json")
	n.r.Header.Set("Idempotency-Key", "k")
	n.r.Header.Set("X-Client-ID", "tenant-1")
	n.r.ContentLength = int64(len(body))
	n.r.Body = io.NopCloser(&n.body)
	return n
}

func (n *netHTTP) serve(key string) int {
	n.body.Reset(body)
	n.r.Header["Idempotency-Key"][0] = key
	clear(n.w.h)
	n.w.code = 0
	n.h.ServeHTTP(&n.w, n.r)
	return n.w.code
}

type discard struct {
	h    http.Header
	code int
}

func (d *discard) Header() http.Header { return d.h }
func (d *discard) WriteHeader(code int) {
	if d.code == 0 {
		d.code = code
	}
}
func (d *discard) Write(p []byte) (int, error) {
	if d.code == 0 {
		d.code = http.StatusOK
	}
	return len(p), nil
}

// fast serves through a fasthttp handler (Fiber) with a reused request context.
type fast struct {
	h   fasthttp.RequestHandler
	ctx fasthttp.RequestCtx
}

func newFast(h fasthttp.RequestHandler) *fast {
	f := &fast{h: h}
	f.ctx.Request.Header.SetMethod(fasthttp.MethodPost)
	f.ctx.Request.SetRequestURI("/api/transfers")
	f.ctx.Request.Header.SetContentType("application/json")
	f.ctx.Request.Header.Set("X-Client-ID", "tenant-1")
	return f
}

func (f *fast) serve(key string) int {
	f.ctx.Response.Reset()
	f.ctx.Request.Header.Set("Idempotency-Key", key)
	f.ctx.Request.SetBody(body)
	f.h(&f.ctx)
	return f.ctx.Response.StatusCode()
}
