package middleware

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// With WithCancelOnDisconnect, a client that hangs up while the handler runs must
// not poison the key: a handler that gives up on its cancelled context without
// writing is not stored as an empty 200.
func TestClientGoneHandlerWroteNothingReleases(t *testing.T) {
	entered := make(chan struct{}, 1)
	events := make(chan Event, 4)
	var runs atomic.Int32
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			entered <- struct{}{}
			<-r.Context().Done() // the client went away: give up
			return
		}
		w.Write([]byte("slept"))
	}, WithCancelOnDisconnect(true), WithObserver(ObserverFunc(func(_ context.Context, ev Event) { events <- ev })))
	srv := httptest.NewServer(e.h)
	defer srv.Close()
	post := func(ctx context.Context) (*http.Response, error) {
		r, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/slow", strings.NewReader("b"))
		r.Header.Set("Idempotency-Key", "k")
		return srv.Client().Do(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := post(ctx); errc <- err }()
	<-entered
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("cancelled request succeeded")
	}
	if ev := <-events; ev.Decision != Released {
		t.Fatalf("client gone, nothing written: decision %v, want released", ev.Decision)
	}
	resp, err := post(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "slept" || resp.Header.Get(DefaultReplayedHeader) != "" || e.calls.Load() != 2 {
		t.Fatalf("retry got %d %q replayed=%q, calls %d; want a fresh execution", resp.StatusCode, b,
			resp.Header.Get(DefaultReplayedHeader), e.calls.Load())
	}
}

// By default a hang-up never runs a request twice: the handler's context is not
// cancelled when the client goes away, the handler finishes, its whole response is
// stored although the connection is dead, and the retry replays it.
func TestHangUpDoesNotRunTwice(t *testing.T) {
	entered, proceed := make(chan struct{}), make(chan struct{})
	requestCtx := make(chan context.Context, 2)
	events := make(chan Event, 4)
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-proceed
		if err := r.Context().Err(); err != nil {
			t.Errorf("handler's context cancelled by the hang-up: %v", err)
		}
		w.Write([]byte("charged once"))
	}, WithObserver(ObserverFunc(func(_ context.Context, ev Event) { events <- ev })))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requestCtx <- r.Context()
		e.h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	post := func(ctx context.Context) (*http.Response, error) {
		r, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/slow", strings.NewReader("b"))
		r.Header.Set("Idempotency-Key", "hang-1")
		return srv.Client().Do(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := post(ctx); errc <- err }()
	<-entered
	cancel() // the client hangs up
	if err := <-errc; err == nil {
		t.Fatal("cancelled request succeeded")
	}
	<-(<-requestCtx).Done() // the server saw the hang-up
	close(proceed)
	if ev := <-events; ev.Decision != Executed || ev.Status != 200 {
		t.Fatalf("event %+v, want executed and stored", ev)
	}
	resp, err := post(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "charged once" || resp.Header.Get(DefaultReplayedHeader) != "true" || e.calls.Load() != 1 {
		t.Fatalf("retry got %d %q replayed=%q, executions %d; want the replay, 1", resp.StatusCode, b,
			resp.Header.Get(DefaultReplayedHeader), e.calls.Load())
	}
}

// failingWriter accepts limit bytes, then fails every write (a client gone or a
// write deadline passed).
type failingWriter struct {
	http.ResponseWriter
	limit int
}

func (f *failingWriter) Write(p []byte) (int, error) {
	if len(p) <= f.limit {
		f.limit -= len(p)
		return f.ResponseWriter.Write(p)
	}
	n, _ := f.ResponseWriter.Write(p[:f.limit])
	f.limit = 0
	return n, errors.New("write: broken pipe")
}

// The record keeps what the handler answered, not the part of it that reached
// one client: a failed live write does not truncate the stored body.
func TestFailedLiveWriteStoresHandlersBody(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("hello "))
		w.Write([]byte("world"))
	})
	w := httptest.NewRecorder()
	e.h.ServeHTTP(&failingWriter{ResponseWriter: w, limit: 8}, req("POST", "/x", "k", "b"))
	if w.Body.String() != "hello wo" {
		t.Fatalf("live %q", w.Body)
	}
	if r := e.do(req("POST", "/x", "k", "b")); r.Body.String() != "hello world" || r.Header().Get(DefaultReplayedHeader) != "true" {
		t.Fatalf("replay %q, want the handler's whole body", r.Body)
	}
}

// A body shorter than the Content-Length the handler declared is incomplete (the
// handler stopped early, e.g. on a write error): it is not stored.
func TestShortBodyAgainstContentLengthReleases(t *testing.T) {
	full := true
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		w.Write([]byte("01234"))
		if full {
			w.Write([]byte("56789"))
		}
	})
	full = false
	e.do(req("POST", "/x", "k", "b"))
	if ev := e.lastEvent(); ev.Decision != Released {
		t.Fatalf("short body: decision %v, want released", ev.Decision)
	}
	full = true
	if w := e.do(req("POST", "/x", "k", "b")); w.Body.String() != "0123456789" || e.calls.Load() != 2 {
		t.Fatalf("retry %q calls %d", w.Body, e.calls.Load())
	}
	if w := e.do(req("POST", "/x", "k", "b")); w.Body.String() != "0123456789" || w.Header().Get(DefaultReplayedHeader) != "true" {
		t.Fatalf("complete body not stored: %q", w.Body)
	}
}

// The 503 of a failing store always carries Retry-After, at least 1 second (a
// negative one makes New fail: TestNewRefusesInvalidRules).
func TestStoreErrorRetryAfterAtLeastOneSecond(t *testing.T) {
	for _, d := range []time.Duration{0, time.Millisecond} {
		e := newEnv(t, echoHandler, WithStoreFailure(policy.StoreFailureRule{RetryAfter: d}))
		e.st.claimErr = errors.New("down")
		w := e.do(req("POST", "/x", "k", "b"))
		checkProblem(t, w, http.StatusServiceUnavailable, CodeStoreUnavailable)
		if got := w.Header().Get("Retry-After"); got != "1" {
			t.Errorf("WithStoreFailure(policy.StoreFailureRule{RetryAfter: %v}): Retry-After %q, want 1", d, got)
		}
	}
}

// The first final status is the one stored; a second WriteHeader changes nothing.
func TestWriteHeaderTwiceStoresFirst(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.WriteHeader(http.StatusInternalServerError)
		w.Write([]byte("made"))
	})
	e.do(req("POST", "/x", "k", "b"))
	if w := e.do(req("POST", "/x", "k", "b")); w.Code != http.StatusCreated || w.Body.String() != "made" || e.calls.Load() != 1 {
		t.Fatalf("%d %q calls %d", w.Code, w.Body, e.calls.Load())
	}
}

// Hostile key header values, over the wire and in ParseKey.
func TestHostileKeys(t *testing.T) {
	k255, k256 := strings.Repeat("a", 255), strings.Repeat("a", 256)
	for _, tt := range []struct {
		in   string
		want string // "" means invalid
	}{
		{k255, k255},
		{k256, ""},
		{`"` + strings.Repeat("a", 253) + `\\"`, strings.Repeat("a", 253) + `\`}, // 254 decoded
		{`"` + strings.Repeat("a", 254) + `\""`, strings.Repeat("a", 254) + `"`}, // 255 decoded, 257 raw
		{`"` + strings.Repeat("a", 255) + `\""`, ""},                             // 256 decoded
		{`"a,b"`, "a,b"},  // a comma inside the string is data
		{`a,b`, ""},       // two list members
		{`"a", "a"`, ""},  // a proxy joined two lines
		{`"a";b=?1`, "a"}, // parameters ignored
		{`"a";b=?2`, ""},
		{`"a";b="x`, ""},
		{`"a" ;b=1`, ""},
		{"a\x00b", ""},
		{"\"a\x7fb\"", ""},
		{"\"caf\xc3\xa9\"", ""},
		{`"a\u0041"`, ""},
		{`"a\\"b"`, ""},
		{`?1`, ""},
		{`"a"` + "\t", "a"},
	} {
		got, err := ParseKey(tt.in)
		if tt.want == "" {
			if err == nil {
				t.Errorf("ParseKey(%q) = %q, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	// Over the wire, several lines are refused even when they agree.
	e := newEnv(t, echoHandler)
	srv := httptest.NewServer(e.h)
	defer srv.Close()
	for _, lines := range [][]string{{"a", "a"}, {`"a"`, ""}, {k256}} {
		r, _ := http.NewRequest("POST", srv.URL+"/x", strings.NewReader("b"))
		r.Header["Idempotency-Key"] = lines
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("lines %q: status %d", lines, resp.StatusCode)
		}
	}
	if e.calls.Load() != 0 {
		t.Fatalf("handler ran %d times", e.calls.Load())
	}
}

// Bodies at and around the fingerprint limit, with and without Content-Length.
func TestBodyLimitEdges(t *testing.T) {
	const limit = 64
	e := newEnv(t, echoHandler, WithRequestFingerprint(FingerprintRule{MaxBody: limit}))
	srv := httptest.NewServer(e.h)
	defer srv.Close()
	for i, tt := range []struct {
		n       int
		chunked bool
		want    int
	}{
		{limit - 1, false, 201}, {limit, false, 201}, {limit + 1, false, 413},
		{limit - 1, true, 201}, {limit, true, 201}, {limit + 1, true, 413}, {10 * limit, true, 413},
		{0, true, 201},
	} {
		body := strings.Repeat("x", tt.n)
		var rd io.Reader = strings.NewReader(body)
		if tt.chunked {
			rd = io.MultiReader(rd) // hides the length: sent chunked
		}
		r, _ := http.NewRequest("POST", srv.URL+"/x", rd)
		r.Header.Set("Idempotency-Key", "k"+strconv.Itoa(i))
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.want || tt.want == 201 && string(got) != body {
			t.Errorf("%d bytes chunked=%v: %d, %d bytes back", tt.n, tt.chunked, resp.StatusCode, len(got))
		}
	}
}

// End to end on the real clocks: a handler running for several leases keeps
// its claim through background renewal; duplicates get 409 the whole time,
// never a takeover. The lease is 1 s, so a renewal (every third of it) may be
// late by up to 0.67 s on a loaded machine before the lease runs out: with
// claim.MinLease (100 ms) this failed 3 to 4 times in 15 under load. The fake-clock
// tests cover the renewal schedule itself.
func TestSlowHandlerRenewsOnRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("waits on the real clock")
	}
	t.Parallel() // 3 s of real time, spent waiting
	const lease = time.Second
	entered, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	m, err := New(memory.New(), GlobalScope, WithLease(lease), WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) > 1 {
			w.Write([]byte("second execution"))
			return
		}
		entered <- struct{}{}
		<-release
		w.Write([]byte("done"))
	}))
	done := make(chan *httptest.ResponseRecorder)
	go func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req("POST", "/slow", "k", "b"))
		done <- w
	}()
	<-entered
	deadline := time.Now().Add(3 * lease)
	for n := 0; time.Now().Before(deadline); n++ {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req("POST", "/slow", "k", "b"))
		if w.Code != http.StatusConflict {
			t.Fatalf("duplicate %d after %v: status %d, want 409 (lease not renewed?)", n, time.Until(deadline), w.Code)
		}
		time.Sleep(lease / 4) // real time must pass for the lease to matter
	}
	close(release)
	if w := <-done; w.Body.String() != "done" || runs.Load() != 1 {
		t.Fatalf("%q, runs %d", w.Body, runs.Load())
	}
}

// The dangerous order of the stale-holder row: the holder whose lease was taken
// over finishes first, while the new holder still runs. Its answer reaches its
// own client but is not stored; the new holder's is the one replayed.
func TestStaleHolderFinishingFirstIsNotStored(t *testing.T) {
	var runs atomic.Int32
	gates := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	entered := make(chan struct{})
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1) - 1
		entered <- struct{}{}
		<-gates[n]
		w.Write([]byte("run " + strconv.Itoa(int(n))))
	})
	done := [2]chan *httptest.ResponseRecorder{make(chan *httptest.ResponseRecorder), make(chan *httptest.ResponseRecorder)}
	go func() { done[0] <- e.do(req("POST", "/x", "k", "b")) }()
	<-entered
	e.now.Add(claim.DefaultLease + time.Second) // the first holder stalls past its lease
	go func() { done[1] <- e.do(req("POST", "/x", "k", "b")) }()
	<-entered
	close(gates[0])
	if w := <-done[0]; w.Body.String() != "run 0" {
		t.Fatalf("stale holder's client got %q", w.Body)
	}
	if ev := e.lastEvent(); ev.Decision != LeaseLost {
		t.Fatalf("stale completion: %v, want lease_lost", ev.Decision)
	}
	checkProblem(t, e.do(req("POST", "/x", "k", "b")), http.StatusConflict, CodeInFlight)
	close(gates[1])
	<-done[1]
	if w := e.do(req("POST", "/x", "k", "b")); w.Body.String() != "run 1" || w.Header().Get(DefaultReplayedHeader) != "true" {
		t.Fatalf("replayed %q, want the new holder's answer", w.Body)
	}
}

// blockingRelease holds every Release until unblocked, so a test can look at what
// the client has received while the claim is not yet released.
type blockingRelease struct {
	store.Store
	entered, unblock chan struct{}
}

func (b *blockingRelease) Release(ctx context.Context, id store.ID, tok store.Token) error {
	b.entered <- struct{}{}
	<-b.unblock
	return b.Store.Release(ctx, id, tok)
}

// A response the claim is released for never reaches the client before the
// release: a client that retries as soon as it has it never meets the dead claim.
func TestReleasedResponseHeldUntilReleased(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"503 with a body, flushed", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "4")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("busy"))
			http.NewResponseController(w).Flush()
		}},
		{"429 without a body", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTooManyRequests) }},
		{"hijacked", func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"))
			conn.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := &blockingRelease{Store: memory.New(), entered: make(chan struct{}), unblock: make(chan struct{})}
			m, err := New(bs, GlobalScope, WithLogger(discardLogger()))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(m.Handler(tc.handler))
			defer srv.Close()
			unblock := sync.OnceFunc(func() { close(bs.unblock) })
			defer unblock() // before srv.Close, on failure too
			got := make(chan int, 1)
			go func() {
				r, _ := http.NewRequest("POST", srv.URL, strings.NewReader("b"))
				r.Header.Set("Idempotency-Key", "k")
				resp, err := srv.Client().Do(r)
				if err != nil {
					got <- -1
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				got <- resp.StatusCode
			}()
			<-bs.entered
			select {
			case code := <-got:
				t.Fatalf("the client had its response (%d) before the release", code)
			case <-time.After(50 * time.Millisecond): // a response sent early would arrive in time
			}
			unblock()
			if code := <-got; code <= 0 {
				t.Fatalf("client: %d", code)
			}
		})
	}
}

// blockingClaim holds each claim.Claim until gone is closed, then claims unless its
// context is done by then (as a driver whose query was cancelled does).
type blockingClaim struct {
	store.Store
	entered chan struct{}
	gone    chan struct{}
}

func (b *blockingClaim) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	b.entered <- struct{}{}
	<-b.gone
	if err := ctx.Err(); err != nil {
		return store.ClaimResult{}, err
	}
	return b.Store.Claim(ctx, req)
}

// A client that hangs up while its claim is in the store (net/http cancels the
// request's context; here the test cancels it): by default the claim is not
// cancelled (nor is the handler), so the request runs once and its retry replays
// it; with WithCancelOnDisconnect the cancelled claim is neither a store outage
// (nothing logged, the event's decision is ClientGone, not StoreError) nor a
// reason to run the handler unprotected (fail open).
func TestHangUpDuringClaim(t *testing.T) {
	for _, cancelOnGone := range []bool{false, true} {
		t.Run(fmt.Sprint("cancel on disconnect ", cancelOnGone), func(t *testing.T) {
			bs := &blockingClaim{Store: memory.New(), entered: make(chan struct{}), gone: make(chan struct{})}
			logs := &logRecorder{}
			var events []Event
			var runs atomic.Int32
			m, err := New(bs, GlobalScope, WithClock(&fakeClock{}), WithLogger(slog.New(logs)), WithStoreFailure(policy.StoreFailureRule{FailOpen: true}),
				WithCancelOnDisconnect(cancelOnGone), WithObserver(ObserverFunc(func(_ context.Context, ev Event) { events = append(events, ev) })))
			if err != nil {
				t.Fatal(err)
			}
			h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Write([]byte("ran"))
			}))
			ctx, hangUp := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				h.ServeHTTP(httptest.NewRecorder(), req("POST", "/x", "k", "b").WithContext(ctx))
			}()
			<-bs.entered
			hangUp() // returns once every context derived from ctx is cancelled
			close(bs.gone)
			<-done
			if n, r := logs.count(slog.LevelWarn); n != 0 {
				t.Fatalf("logged %q at %v after a hang-up", r.Message, r.Level)
			}
			ev := events[0]
			if cancelOnGone {
				if ev.Decision != ClientGone || !errors.Is(ev.Err, context.Canceled) || runs.Load() != 0 {
					t.Fatalf("event %+v after %d runs; want the cancelled claim (client_gone, not a store error), no run", ev, runs.Load())
				}
				return
			}
			if ev.Decision != Executed || runs.Load() != 1 {
				t.Fatalf("event %+v after %d runs; want executed once", ev, runs.Load())
			}
			go func() { <-bs.entered }()
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req("POST", "/x", "k", "b"))
			if w.Body.String() != "ran" || w.Header().Get(DefaultReplayedHeader) != "true" || runs.Load() != 1 {
				t.Fatalf("retry: %d %q after %d runs; want the replay", w.Code, w.Body, runs.Load())
			}
		})
	}
}

// leakyStore keeps the contexts of its calls past the calls, reading their values
// from goroutines of its own until stop is closed (as pgxpool does with a dial it
// finishes in the background).
type leakyStore struct {
	store.Store
	stop chan struct{}
	wg   sync.WaitGroup
}

type leakKey struct{}

func (l *leakyStore) keep(ctx context.Context) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			select {
			case <-l.stop:
				return
			default:
				_ = ctx.Value(leakKey{})
				runtime.Gosched()
			}
		}
	}()
}

func (l *leakyStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	l.keep(ctx)
	return l.Store.Claim(ctx, req)
}

func (l *leakyStore) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	l.keep(ctx)
	return l.Store.Complete(ctx, id, tok, resp, ret)
}

// A store that keeps a call's context past the call races with nothing (run
// under -race): the pooled state the context reads is reset for the next
// request under a lock.
func TestStoreKeepsContextPastCall(t *testing.T) {
	ls := &leakyStore{Store: memory.New(), stop: make(chan struct{})}
	m, err := New(ls, GlobalScope, WithClock(&fakeClock{}), WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	for i := range 50 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req("POST", "/x", "k"+strconv.Itoa(i), "b"))
		if w.Code != http.StatusCreated {
			t.Fatalf("request %d: %d", i, w.Code)
		}
		for range 3 {
			runtime.Gosched() // let the store's goroutines read between two requests
		}
	}
	close(ls.stop)
	ls.wg.Wait()
}

// reclaimBlocks lets the first two claims through (the holder's and the
// duplicate's first, which finds the key in flight: inFlight is closed after
// it) and blocks every later one (the duplicate's claim after its wait) until
// gone is closed; then, as a network store would, it fails when its context
// has ended.
type reclaimBlocks struct {
	store.Store
	n                 atomic.Int32
	inFlight, entered chan struct{}
	gone              chan struct{}
}

func (b *reclaimBlocks) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	n := b.n.Add(1)
	if n >= 3 {
		b.entered <- struct{}{}
		<-b.gone
		if err := ctx.Err(); err != nil {
			return store.ClaimResult{}, err
		}
	}
	res, err := b.Store.Claim(ctx, req)
	if n == 2 {
		close(b.inFlight)
	}
	return res, err
}

// A waiting duplicate (WithWaitInFlight) whose client hangs up while its claim
// after the wake-up is in the store: by default that claim is not cancelled
// either, so the duplicate ends with the original's replay, logs nothing and
// counts no outage; with WithCancelOnDisconnect the cancelled claim is no
// outage either.
func TestHangUpDuringReclaim(t *testing.T) {
	for _, cancelOnGone := range []bool{false, true} {
		t.Run(fmt.Sprint("cancel on disconnect ", cancelOnGone), func(t *testing.T) {
			bs := &reclaimBlocks{Store: memory.New(), inFlight: make(chan struct{}), entered: make(chan struct{}), gone: make(chan struct{})}
			logs := &logRecorder{}
			var mu sync.Mutex
			var events []Event
			m, err := New(bs, GlobalScope, WithLogger(slog.New(logs)), WithWaitInFlight(time.Minute), WithLease(time.Minute),
				WithCancelOnDisconnect(cancelOnGone), WithObserver(ObserverFunc(func(_ context.Context, ev Event) {
					mu.Lock()
					events = append(events, ev)
					mu.Unlock()
				})))
			if err != nil {
				t.Fatal(err)
			}
			gate, started := make(chan struct{}), make(chan struct{})
			var runs atomic.Int32
			h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					close(started)
					<-gate
				}
				w.WriteHeader(http.StatusCreated)
				w.Write([]byte("ran"))
			}))
			orig := make(chan struct{})
			go func() {
				defer close(orig)
				h.ServeHTTP(httptest.NewRecorder(), req("POST", "/x", "k", "b"))
			}()
			<-started
			ctx, hangUp := context.WithCancel(context.Background())
			dup := make(chan *httptest.ResponseRecorder)
			go func() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req("POST", "/x", "k", "b").WithContext(ctx))
				dup <- w
			}()
			<-bs.inFlight // the duplicate found the key in flight and waits
			close(gate)   // the original completes and wakes it
			<-orig
			<-bs.entered // the duplicate's claim after the wake-up is in the store
			hangUp()
			close(bs.gone)
			w := <-dup
			if n, r := logs.count(slog.LevelWarn); n != 0 {
				t.Fatalf("logged %q at %v after a hang-up", r.Message, r.Level)
			}
			mu.Lock()
			ev := events[len(events)-1]
			mu.Unlock()
			if runs.Load() != 1 {
				t.Fatalf("%d runs, want 1", runs.Load())
			}
			if cancelOnGone {
				if ev.Decision != ClientGone || !errors.Is(ev.Err, context.Canceled) {
					t.Fatalf("event %+v; want the cancelled claim", ev)
				}
				return
			}
			if ev.Decision != Replayed || w.Code != http.StatusCreated || w.Body.String() != "ran" ||
				w.Header().Get(DefaultReplayedHeader) != "true" {
				t.Fatalf("event %+v, answer %d %q; want the original's replay", ev, w.Code, w.Body)
			}
		})
	}
}
