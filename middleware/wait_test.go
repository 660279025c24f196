package middleware

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// waitCounter counts the store calls of waiting duplicates; with waiter false it
// hides the memory store's Wait, so the middleware polls.
type waitCounter struct {
	*memory.Store
	claims, waits atomic.Int32
}

func (c *waitCounter) Claim(ctx context.Context, r store.ClaimRequest) (store.ClaimResult, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, r)
}

func (c *waitCounter) Wait(ctx context.Context, id store.ID) error {
	c.waits.Add(1)
	return c.Store.Wait(ctx, id)
}

// polled is a store without store.Waiter.
type polled struct{ store.Store }

// waitEnv is a middleware over a memory store on the bubble's clock, whose
// handler answers each call with the next of answers once gate is closed.
type waitEnv struct {
	st      *waitCounter
	h       http.Handler
	gate    chan struct{}
	calls   atomic.Int32
	answers []int
	mu      sync.Mutex
	events  []Event
}

func newWaitEnv(t *testing.T, poll bool, answers []int, opts ...Option) *waitEnv {
	e := &waitEnv{st: &waitCounter{Store: memory.New()}, gate: make(chan struct{}), answers: answers}
	var s store.Store = e.st
	if poll {
		s = polled{e.st}
	}
	obs := ObserverFunc(func(_ context.Context, ev Event) { e.mu.Lock(); e.events = append(e.events, ev); e.mu.Unlock() })
	m, err := New(s, GlobalScope, append([]Option{WithObserver(obs), WithLogger(discardLogger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	e.h = m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(e.calls.Add(1))
		if n == 1 {
			<-e.gate
		}
		status := e.answers[min(n, len(e.answers))-1]
		w.WriteHeader(status)
		w.Write([]byte("answer " + strconv.Itoa(n)))
	}))
	return e
}

// send serves one request with key k in its own goroutine.
func (e *waitEnv) send(ctx context.Context) <-chan *httptest.ResponseRecorder {
	out := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w := httptest.NewRecorder()
		e.h.ServeHTTP(w, req("POST", "/pay", "k", `{"amountCents":1}`).WithContext(ctx))
		out <- w
	}()
	return out
}

func TestWaitInFlight(t *testing.T) {
	cases := []struct {
		name    string
		poll    bool
		answers []int         // the handler's statuses, call by call
		hold    time.Duration // how long the original runs
		bound   time.Duration
		// want of the duplicate
		status   int
		body     string
		replayed bool
		calls    int32
		waited   time.Duration
	}{
		{"original completes: replay", false, []int{201}, time.Second, 5 * time.Second, 201, "answer 1", true, 1, time.Second},
		{"original releases: the duplicate runs once", false, []int{503, 200}, time.Second, 5 * time.Second, 200, "answer 2", false, 2, time.Second},
		{"original outlives the bound: 409", false, []int{201}, 3 * time.Second, 2 * time.Second, 409, "", false, 1, 2 * time.Second},
		{"polled store, original completes: replay", true, []int{201}, time.Second, 5 * time.Second, 201, "answer 1", true, 1, 0},
		{"polled store, original outlives the bound: 409", true, []int{201}, 3 * time.Second, 2 * time.Second, 409, "", false, 1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newWaitEnv(t, tc.poll, tc.answers, WithWaitInFlight(tc.bound))
				orig := e.send(t.Context())
				synctest.Wait() // the original holds the claim, its handler blocked
				t0 := time.Now()
				dup := e.send(t.Context())
				synctest.Wait()
				if !tc.poll && (e.st.claims.Load() != 2 || e.st.waits.Load() != 1) {
					t.Fatalf("a waiting duplicate made %d claims and %d waits so far, want 2 and 1", e.st.claims.Load(), e.st.waits.Load())
				}
				go func() { time.Sleep(tc.hold); close(e.gate) }()
				wd := <-dup
				elapsed := time.Since(t0)
				wo := <-orig
				if wo.Code != tc.answers[0] {
					t.Fatalf("original: %d", wo.Code)
				}
				if wd.Code != tc.status {
					t.Fatalf("duplicate: status %d, want %d; body %s", wd.Code, tc.status, wd.Body)
				}
				if tc.status == 409 {
					checkProblem(t, wd, 409, CodeInFlight)
					if ra := wd.Header().Get("Retry-After"); ra == "" || ra == "0" {
						t.Errorf("409 after waiting: Retry-After %q", ra)
					}
					if elapsed != tc.bound {
						t.Errorf("409 after %v, want the bound %v", elapsed, tc.bound)
					}
				} else if wd.Body.String() != tc.body {
					t.Errorf("duplicate's body %q, want %q", wd.Body, tc.body)
				}
				if got := wd.Header().Get("Idempotent-Replayed") == "true"; got != tc.replayed {
					t.Errorf("duplicate replayed = %v, want %v", got, tc.replayed)
				}
				if n := e.calls.Load(); n != tc.calls {
					t.Errorf("handler ran %d times, want %d", n, tc.calls)
				}
				if !tc.poll {
					// One claim per wake-up: the first, the one after the wait.
					if c, w := e.st.claims.Load(), e.st.waits.Load(); c != 3 || w != 1 {
						t.Errorf("store calls: %d claims, %d waits; want 3 and 1", c, w)
					}
				} else if c := e.st.claims.Load(); tc.status != 409 && c > 15 {
					t.Errorf("polling made %d claims in %v", c, tc.hold)
				}
				if tc.waited > 0 {
					var ev Event
					e.mu.Lock()
					for _, x := range e.events {
						if x.Waited > 0 {
							ev = x
						}
					}
					e.mu.Unlock()
					if ev.Waited != tc.waited {
						t.Errorf("event Waited = %v, want %v", ev.Waited, tc.waited)
					}
				}
			})
		})
	}
}

// TestWaitInFlightTakesOverExpiredLease: the original's holder died (its claim is
// never completed); the waiting duplicate wakes at the end of its lease, takes
// the key over and runs.
func TestWaitInFlightTakesOverExpiredLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newWaitEnv(t, false, []int{200}, WithWaitInFlight(5*time.Second))
		close(e.gate)
		// A holder that claimed the key as the middleware would, with a 1s lease,
		// and died: no renewal, no completion.
		body := `{"amountCents":1}`
		fp, err := fingerprint.Sum(fingerprint.Request{Method: "POST", Route: "/pay", Body: []byte(body)}, fingerprint.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.st.Store.Claim(t.Context(), store.ClaimRequest{ID: store.ID{Key: "k"}, Fingerprint: fp,
			Lease: time.Second, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		w := <-e.send(t.Context())
		if w.Code != 200 || w.Header().Get("Idempotent-Replayed") != "" || e.calls.Load() != 1 {
			t.Fatalf("duplicate after the holder died: %d %q, handler ran %d times", w.Code, w.Body, e.calls.Load())
		}
		if d := time.Since(t0); d < time.Second || d > time.Second+50*time.Millisecond {
			t.Errorf("took over after %v, want just past the 1s lease", d)
		}
		if c, w := e.st.claims.Load(), e.st.waits.Load(); c != 2 || w != 1 {
			t.Errorf("store calls: %d claims, %d waits; want 2 and 1", c, w)
		}
	})
}

// TestWaitInFlightClientGone: a waiting duplicate whose client goes away (or
// whose own deadline passes) stops waiting at once, claims nothing more and
// leaves no goroutine behind (synctest fails on one still blocked).
func TestWaitInFlightClientGone(t *testing.T) {
	for _, how := range []string{"cancelled", "deadline"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newWaitEnv(t, false, []int{201}, WithWaitInFlight(time.Minute))
				orig := e.send(t.Context())
				synctest.Wait()
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
				defer cancel()
				t0 := time.Now()
				dup := e.send(ctx)
				synctest.Wait()
				if how == "cancelled" {
					cancel()
				}
				wd := <-dup
				if want := map[string]time.Duration{"cancelled": 0, "deadline": 2 * time.Second}[how]; time.Since(t0) != want {
					t.Errorf("the duplicate returned after %v, want %v", time.Since(t0), want)
				}
				checkProblem(t, wd, 409, CodeInFlight)
				if c, w := e.st.claims.Load(), e.st.waits.Load(); c != 2 || w != 1 {
					t.Errorf("store calls: %d claims, %d waits; want 2 and 1 (no claim after the client left)", c, w)
				}
				close(e.gate)
				<-orig
			})
		})
	}
}

// TestWaitInFlightManyWaiters: many duplicates of one key wait on one
// notification; each makes exactly one claim per wake-up (no herd beyond one
// claim per waiter), and all end with the original's answer, or, when the
// original released, with the one run among them that won the key.
func TestWaitInFlightManyWaiters(t *testing.T) {
	const n = 50
	for _, first := range []int{201, 503} {
		t.Run(strconv.Itoa(first), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newWaitEnv(t, false, []int{first, 200}, WithWaitInFlight(10*time.Second))
				orig := e.send(t.Context())
				synctest.Wait()
				dups := make([]<-chan *httptest.ResponseRecorder, n)
				for i := range dups {
					dups[i] = e.send(t.Context())
				}
				synctest.Wait()
				if c, w := e.st.claims.Load(), e.st.waits.Load(); c != n+1 || w != n {
					t.Fatalf("%d waiters blocked after %d claims and %d waits, want %d and %d", n, c, w, n+1, n)
				}
				close(e.gate)
				<-orig
				bodies := map[string]int{}
				for _, d := range dups {
					w := <-d
					bodies[strconv.Itoa(w.Code)+" "+w.Body.String()]++
				}
				want := map[string]int{"201 answer 1": n}
				wantCalls := int32(1)
				if first == 503 {
					want, wantCalls = map[string]int{"200 answer 2": n}, 2
				}
				if len(bodies) != 1 || bodies[firstKey(want)] != n {
					t.Errorf("answers %v, want %v", bodies, want)
				}
				if c := e.calls.Load(); c != wantCalls {
					t.Errorf("handler ran %d times, want %d", c, wantCalls)
				}
				c, w := e.st.claims.Load(), e.st.waits.Load()
				if c != 1+n+w {
					t.Errorf("%d claims for %d waits of %d waiters: not one claim per wake-up", c, w, n)
				}
				if first == 201 && w != n {
					t.Errorf("%d waits, want %d (one notification wakes all)", w, n)
				}
				if w > 2*n {
					t.Errorf("%d waits for %d waiters", w, n)
				}
			})
		})
	}
}

func firstKey(m map[string]int) string {
	for k := range m {
		return k
	}
	return ""
}

func TestWaitInFlightNegativeBound(t *testing.T) {
	if _, err := New(memory.New(), GlobalScope, WithWaitInFlight(-time.Second)); err == nil {
		t.Fatal("New accepted a negative wait bound")
	}
}

// unsupported is a store whose Wait says it cannot wait.
type unsupported struct {
	*waitCounter
}

func (u unsupported) Wait(context.Context, store.ID) error {
	u.waits.Add(1)
	return fmt.Errorf("no listener: %w", errors.ErrUnsupported)
}

// TestWaitInFlightUnsupportedPolls: a store whose Wait answers ErrUnsupported is
// polled with back-off; the duplicate still gets the replay.
func TestWaitInFlightUnsupportedPolls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &waitCounter{Store: memory.New()}
		gate := make(chan struct{})
		var calls atomic.Int32
		m, err := New(unsupported{st}, GlobalScope, WithWaitInFlight(5*time.Second), WithLogger(discardLogger()))
		if err != nil {
			t.Fatal(err)
		}
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			<-gate
			w.WriteHeader(201)
		}))
		send := func() <-chan *httptest.ResponseRecorder {
			out := make(chan *httptest.ResponseRecorder, 1)
			go func() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req("POST", "/pay", "k", "x"))
				out <- w
			}()
			return out
		}
		orig := send()
		synctest.Wait()
		dup := send()
		go func() { time.Sleep(time.Second); close(gate) }()
		wd := <-dup
		<-orig
		if wd.Code != 201 || wd.Header().Get("Idempotent-Replayed") != "true" || calls.Load() != 1 {
			t.Fatalf("duplicate: %d replayed=%q, handler ran %d times", wd.Code, wd.Header().Get("Idempotent-Replayed"), calls.Load())
		}
		if w := st.waits.Load(); w != 1 {
			t.Errorf("%d Wait calls; want 1 (then polling)", w)
		}
		if c := st.claims.Load(); c > 15 {
			t.Errorf("%d claims polling for 1s", c)
		}
	})
}

// hangingReclaim is a store with I/O (not store.InProcess) whose claims after the
// first hang until their context ends.
type hangingReclaim struct {
	*waitCounter
}

func (h hangingReclaim) Claim(ctx context.Context, r store.ClaimRequest) (store.ClaimResult, error) {
	if h.claims.Load() >= 2 { // the original's and the duplicate's first
		h.claims.Add(1)
		<-ctx.Done()
		return store.ClaimResult{}, ctx.Err()
	}
	return h.waitCounter.Claim(ctx, r)
}

func (h hangingReclaim) InProcess() bool { return false }

// TestWaitInFlightReclaimBounded: the claim after a wake-up runs under the claim
// timeout (policy.StoreFailureRule.Timeouts): a store that hangs then answers 503 within it.
func TestWaitInFlightReclaimBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := hangingReclaim{&waitCounter{Store: memory.New()}}
		gate := make(chan struct{})
		m, err := New(st, GlobalScope, WithWaitInFlight(time.Minute), WithLogger(discardLogger()),
			WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: time.Second}}))
		if err != nil {
			t.Fatal(err)
		}
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-gate
			w.WriteHeader(201)
		}))
		send := func() <-chan *httptest.ResponseRecorder {
			out := make(chan *httptest.ResponseRecorder, 1)
			go func() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req("POST", "/pay", "k", "x"))
				out <- w
			}()
			return out
		}
		orig := send()
		synctest.Wait()
		dup := send()
		synctest.Wait() // the duplicate waits
		close(gate)
		<-orig
		t0 := time.Now()
		wd := <-dup
		if d := time.Since(t0); d != time.Second {
			t.Errorf("503 after %v, want the claim timeout 1s", d)
		}
		checkProblem(t, wd, http.StatusServiceUnavailable, CodeStoreUnavailable)
	})
}
