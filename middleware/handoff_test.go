package middleware

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// flakyStore is a store with I/O whose Complete, decided per key and attempt
// (a hash of both and a seed, so a run is reproducible), succeeds, fails at
// once, or hangs past its deadline and then lands anyway (a resumed server runs
// what it was sent), which the background retry then meets.
type flakyStore struct {
	*memory.Store
	seed     uint32
	mu       sync.Mutex
	attempts map[string]int
	late     sync.WaitGroup
}

func (f *flakyStore) InProcess() bool { return false }

func (f *flakyStore) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	f.mu.Lock()
	n := f.attempts[id.Key]
	f.attempts[id.Key] = n + 1
	f.mu.Unlock()
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%s/%d", f.seed, id.Key, n)
	switch h.Sum32() % 4 {
	case 0:
		return errors.New("flaky: connection reset")
	case 1: // hang, then land late
		<-ctx.Done()
		resp.Header, resp.Body = resp.Header.Clone(), append([]byte(nil), resp.Body...) // what was sent
		f.late.Add(1)
		time.AfterFunc(50*time.Millisecond, func() {
			defer f.late.Done()
			f.Store.Complete(context.Background(), id, tok, resp, ret)
		})
		return ctx.Err()
	}
	return f.Store.Complete(ctx, id, tok, resp, ret)
}

// bodyPool is where the handler takes the buffer it writes its body from, and
// puts it back once written.
var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// Many concurrent requests (first runs and duplicates) against a store whose
// completions fail or hang at random: the handler writes from a pooled buffer,
// and an outer middleware rewrites the response's header values in place once
// the protected handler returned. Every key runs once, and once the background
// completions have settled every retry replays the first answer byte for byte.
// Run with -race: the background work must not read what the request's path
// reuses.
func TestHandOffUnderFlakyCompletions(t *testing.T) {
	for seed := uint32(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { handOffRun(t, seed) })
		})
	}
}

func handOffRun(t *testing.T, seed uint32) {
	var pending atomic.Int32
	st := &flakyStore{Store: memory.New(), seed: seed, attempts: map[string]int{}}
	m, err := New(st, GlobalScope, WithLease(3*time.Second), WithLogger(discardLogger()),
		WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Complete: 200 * time.Millisecond}}),
		WithObserver(ObserverFunc(func(_ context.Context, ev Event) {
			if ev.CompletionPending {
				pending.Add(1)
			}
		})))
	if err != nil {
		t.Fatal(err)
	}
	var runsMu sync.Mutex
	runs := map[string]int{}
	inner := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		runsMu.Lock()
		runs[key]++
		runsMu.Unlock()
		w.Header().Set("X-Key", key)
		w.Header()["X-Values"] = []string{"a-" + key, "b-" + key}
		w.WriteHeader(http.StatusCreated)
		bp := bodyPool.Get().(*[]byte)
		b := append((*bp)[:0], strings.Repeat("body-"+key+";", 1+len(key)%7)...)
		w.Write(b)
		clear(b) // the buffer goes back to its pool, to be overwritten
		*bp = b[:0]
		bodyPool.Put(bp)
	}))
	outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner.ServeHTTP(w, r)
		if w.Header().Get(DefaultReplayedHeader) != "" {
			return // a replay's values are the middleware's own
		}
		for _, k := range []string{"X-Key", "X-Values"} { // after the fact: the client has its answer
			v := w.Header()[k]
			for i := range v {
				v[i] = "rewritten"
			}
		}
	})
	serve := func(key string) (int, string, string, string) {
		w := httptest.NewRecorder()
		outer.ServeHTTP(w, req("POST", "/charges", key, "x"))
		return w.Code, w.Body.String(), w.Header().Get(DefaultReplayedHeader), strings.Join(w.Result().Header.Values("X-Values"), ",")
	}
	const keys = 40
	var wg sync.WaitGroup
	for i := range keys {
		for range 2 {
			wg.Go(func() { serve(fmt.Sprint("k", i)) })
		}
	}
	wg.Wait()
	time.Sleep(10 * time.Second) // every background completion ends (at most a lease)
	synctest.Wait()
	st.late.Wait()
	for i := range keys {
		key := fmt.Sprint("k", i)
		code, body, replayed, vals := serve(key)
		want := strings.Repeat("body-"+key+";", 1+len(key)%7)
		if runs[key] != 1 || code != http.StatusCreated || replayed != "true" || body != want || vals != "a-"+key+",b-"+key {
			t.Errorf("%s: %d runs, retry %d %q replayed=%q X-Values %q; want 1 run, the replay of %q with %q",
				key, runs[key], code, body, replayed, vals, want, "a-"+key+",b-"+key)
		}
	}
	if pending.Load() == 0 {
		t.Fatal("no completion went to the background")
	}
}

// hijackWriter is a ResponseWriter whose connection can be hijacked.
type hijackWriter struct{ timedWriter }

func (h *hijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	a, b := net.Pipe()
	b.Close()
	return a, nil, nil
}

// A handler that hijacks its connection releases the claim (its answer is its
// own) and may go on serving the connection for longer than a lease: the
// released claim's renewals stop, and none cancels the handler's context with
// a lease "lost" that was only released.
func TestHijackedHandlerKeepsItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := New(&gateStore{Store: memory.New()}, GlobalScope, WithLease(3*time.Second), WithLogger(discardLogger()))
		if err != nil {
			t.Fatal(err)
		}
		var cause error
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			time.Sleep(5 * time.Second) // a long-lived connection: past a renewal
			cause = context.Cause(r.Context())
		}))
		h.ServeHTTP(&hijackWriter{timedWriter{h: http.Header{}}}, req("POST", "/charges", "k", "x"))
		if cause != nil {
			t.Fatalf("hijacked handler's context cancelled with %v, want live", cause)
		}
	})
}

// Wait is how a program drains what its requests left to the background on
// shutdown: while the store hangs, a completion handed off stays pending and
// Wait gives up with its context's error; once the store answers, Wait returns
// when the record is stored (the retry replays it), and no goroutine is left.
func TestWaitDrainsBackgroundCompletions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &gateStore{Store: memory.New()}
		m, err := New(st, GlobalScope, WithLease(9*time.Second), WithLogger(discardLogger()),
			WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Complete: time.Second, Release: time.Second}}))
		if err != nil {
			t.Fatal(err)
		}
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			st.shut()
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "done")
		}))
		goroutines := bubbleGoroutines()
		if err := m.Wait(t.Context()); err != nil {
			t.Fatalf("Wait with nothing pending: %v", err)
		}
		h.ServeHTTP(&timedWriter{h: http.Header{}}, req("POST", "/charges", "k", "x"))
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		if err := m.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait while the store hangs: %v, want the deadline", err)
		}
		if n := bubbleGoroutines(); n <= goroutines {
			t.Fatalf("%d goroutines while the completion is pending, %d before: the count misses it", n, goroutines)
		}
		st.open()
		if err := m.Wait(t.Context()); err != nil {
			t.Fatalf("Wait once the store answers: %v", err)
		}
		synctest.Wait()
		if n := bubbleGoroutines(); n != goroutines {
			t.Fatalf("%d goroutines after Wait, %d before the request", n, goroutines)
		}
		w := &timedWriter{h: http.Header{}}
		h.ServeHTTP(w, req("POST", "/charges", "k", "x"))
		if w.code != http.StatusCreated || w.body.String() != "done" || w.h.Get(DefaultReplayedHeader) != "true" {
			t.Fatalf("retry after Wait: %d %q, want the replay", w.code, w.body.String())
		}
	})
}

// bubbleGoroutines counts the goroutines of the calling goroutine's synctest
// bubble (other tests' goroutines may come and go meanwhile).
func bubbleGoroutines() int {
	buf := make([]byte, 1<<20)
	stacks := strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
	head, _, _ := strings.Cut(stacks[0], "\n") // the caller's: "goroutine N [running, synctest bubble B]:"
	_, bubble, ok := strings.Cut(head, "synctest bubble ")
	if !ok {
		panic("bubbleGoroutines outside a synctest bubble")
	}
	n := 0
	for _, s := range stacks {
		if h, _, _ := strings.Cut(s, "\n"); strings.HasSuffix(h, "synctest bubble "+bubble) {
			n++
		}
	}
	return n
}

// A duplicate that waits for the claim in flight (WithWaitInFlight) while the
// first request's completion is retried in the background gets the replay once
// the retry stores it, not a second run nor a 409.
func TestWaiterGetsBackgroundCompletion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &gateStore{Store: memory.New()}
		m, err := New(st, GlobalScope, WithLease(9*time.Second), WithLogger(discardLogger()), WithWaitInFlight(5*time.Second),
			WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Complete: time.Second}}))
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				st.shut()
			}
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "done")
		}))
		h.ServeHTTP(&timedWriter{h: http.Header{}}, req("POST", "/charges", "k", "x"))
		st.open()
		// The waiter claims (in flight) before the background retry's back-off passes.
		w := &timedWriter{h: http.Header{}}
		h.ServeHTTP(w, req("POST", "/charges", "k", "x"))
		if w.code != http.StatusCreated || w.body.String() != "done" || w.h.Get(DefaultReplayedHeader) != "true" || runs.Load() != 1 {
			t.Fatalf("waiting duplicate: %d %q replayed=%q, %d runs; want the replay, 1 run", w.code, w.body.String(), w.h.Get(DefaultReplayedHeader), runs.Load())
		}
		if err := m.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}
