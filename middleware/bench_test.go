package middleware

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// benchBody is a 1 KiB JSON request body.
var benchBody = func() []byte {
	b := []byte(`{"fromAccountId":"acc-1","toAccountId":"acc-2","amountCents":1234,"memo":"`)
	b = append(b, strings.Repeat("m", 1024-len(b)-2)...)
	return append(b, `"}`...)
}()

var benchResponse = []byte(`{"balanceCents":98766,"aggregateVersion":42}`)

// benchHandler reads the body and answers a small JSON document.
var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(benchResponse)
})

// discardWriter is a ResponseWriter that keeps nothing but its header map.
type discardWriter struct {
	h    http.Header
	code int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) WriteHeader(code int)        { d.code = code }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) reset()                      { clear(d.h); d.code = 0 }

type benchReq struct {
	r    *http.Request
	body bytes.Reader
}

func (b *benchReq) Read(p []byte) (int, error)         { return b.body.Read(p) }
func (b *benchReq) WriteTo(w io.Writer) (int64, error) { return b.body.WriteTo(w) }
func (b *benchReq) Close() error                       { return nil }

func newBenchReq() *benchReq {
	b := &benchReq{}
	r, _ := http.NewRequest("POST", "http://svc/api/transfers", nil)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", "k")
	r.Header.Set("X-Client-ID", "tenant-1")
	r.ContentLength = int64(len(benchBody))
	r.Body = b
	b.r = r
	return b
}

// next readies the request for one more round with key.
func (b *benchReq) next(key string) *http.Request {
	b.body.Reset(benchBody)
	b.r.Header["Idempotency-Key"][0] = key
	return b.r
}

func newBenchMiddleware(b *testing.B, st store.Store) *Middleware {
	m, err := New(st, ScopeFromHeader("X-Client-ID", "anonymous"), WithLogger(discardLogger()))
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func BenchmarkMiddleware(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		br, w := newBenchReq(), &discardWriter{h: http.Header{}}
		b.ReportAllocs()
		for b.Loop() {
			w.reset()
			benchHandler.ServeHTTP(w, br.next("k"))
		}
		if w.code != http.StatusCreated {
			b.Fatal(w.code)
		}
	})
	b.Run("first", func(b *testing.B) {
		// Steady state: records expire as new ones arrive, so the store holds
		// about liveKeys records (its clock advances retention/liveKeys per request)
		// and a key comes back only after its record expired.
		const liveKeys = 4096
		now := testclock.New(time.Unix(1_700_000_000, 0))
		h := newBenchMiddleware(b, memory.New(memory.WithClock(now.Now))).Handler(benchHandler)
		br, w := newBenchReq(), &discardWriter{h: http.Header{}}
		keys := make([]string, 2*liveKeys)
		for i := range keys {
			keys[i] = "key-" + strconv.Itoa(i)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			now.Add(claim.DefaultRetention / liveKeys)
			w.reset()
			h.ServeHTTP(w, br.next(keys[i%len(keys)]))
			i++
		}
		if w.code != http.StatusCreated || w.h.Get(DefaultReplayedHeader) != "" {
			b.Fatal(w.code)
		}
	})
	b.Run("replay", func(b *testing.B) {
		h := newBenchMiddleware(b, memory.New()).Handler(benchHandler)
		br, w := newBenchReq(), &discardWriter{h: http.Header{}}
		h.ServeHTTP(w, br.next("k"))
		b.ReportAllocs()
		for b.Loop() {
			w.reset()
			h.ServeHTTP(w, br.next("k"))
		}
		if w.code != http.StatusCreated || w.h.Get(DefaultReplayedHeader) != "true" {
			b.Fatal(w.code)
		}
	})
	b.Run("inflight", func(b *testing.B) {
		// The first request's handler holds key k in flight until the benchmark ends;
		// the middleware claims it, so its fingerprint is the one the loop's requests
		// send (a claim made beside the middleware drifts from it: a 422, not a 409).
		entered, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
		h := newBenchMiddleware(b, memory.New()).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release
			benchHandler.ServeHTTP(w, r)
		}))
		go func() {
			defer close(done)
			h.ServeHTTP(&discardWriter{h: http.Header{}}, newBenchReq().next("k"))
		}()
		<-entered
		defer func() { close(release); <-done }()
		br, w := newBenchReq(), &discardWriter{h: http.Header{}}
		b.ReportAllocs()
		for b.Loop() {
			w.reset()
			h.ServeHTTP(w, br.next("k"))
		}
		if w.code != http.StatusConflict {
			b.Fatal(w.code)
		}
	})
}

// nullStore claims every key and forgets everything: it isolates the
// middleware's own cost from a store's.
type nullStore struct{}

func (nullStore) Claim(context.Context, store.ClaimRequest) (store.ClaimResult, error) {
	return store.ClaimResult{Outcome: store.Claimed, Token: store.Token{1}}, nil
}
func (nullStore) Complete(context.Context, store.ID, store.Token, store.Response, time.Duration) error {
	return nil
}
func (nullStore) Release(context.Context, store.ID, store.Token) error              { return nil }
func (nullStore) Renew(context.Context, store.ID, store.Token, time.Duration) error { return nil }

func BenchmarkMiddlewareNullStore(b *testing.B) {
	h := newBenchMiddleware(b, nullStore{}).Handler(benchHandler)
	br, w := newBenchReq(), &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		w.reset()
		h.ServeHTTP(w, br.next("k"))
	}
	if w.code != http.StatusCreated {
		b.Fatal(w.code)
	}
}

// BenchmarkParseKey parses a bare UUID key and its quoted form, as every keyed
// request does.
func BenchmarkParseKey(b *testing.B) {
	const uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	for _, tt := range []struct{ name, in string }{{"bare", uuid}, {"quoted", `"` + uuid + `"`}} {
		b.Run(tt.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParseKey(tt.in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHandlerRequest builds the request a handler runs with under a claim:
// the request, its context and the claim's execution are one allocation (the
// execution), its detached parent none; its cancellation on a lost lease costs
// two more (context.WithCancelCause, only WithCancelOnDisconnect).
func BenchmarkHandlerRequest(b *testing.B) {
	m := newBenchMiddleware(b, nullStore{})
	r := newBenchReq().next("k")
	claim := claim.Claim{ID: store.ID{Scope: "tenant-1", Key: "k"}, Token: store.Token{1}, Retention: claim.DefaultRetention}
	b.ReportAllocs()
	for b.Loop() {
		x := &execution{m: m}
		if hr := x.handlerRequest(r, claim, benchBody); hr.Context() == r.Context() {
			b.Fatal("no context of its own")
		}
	}
	if n := testing.AllocsPerRun(100, func() { x := &execution{m: m}; x.handlerRequest(r, claim, benchBody) }); n != 1 {
		b.Fatalf("%v allocations, want 1 (the execution, which holds the request and its context)", n)
	}
}
