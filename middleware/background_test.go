package middleware

import (
	"context"
	"io"
	"net/http"
	"strings"
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

// gateStore is a store with I/O (not store.InProcess, so its calls run under
// deadlines) that can hang like a SIGSTOPped server: while the gate is shut,
// every call waits for its deadline (then fails, not applied) or for the gate to
// open (then reaches the store, as a resumed server runs what it was sent).
type gateStore struct {
	*memory.Store
	mu       sync.Mutex
	gate     chan struct{} // nil: open
	releases atomic.Int32
}

func (g *gateStore) InProcess() bool { return false }

func (g *gateStore) shut() {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.mu.Unlock()
}

func (g *gateStore) open() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

func (g *gateStore) wait(ctx context.Context) error {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate == nil {
		return nil
	}
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gateStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := g.wait(ctx); err != nil {
		return store.ClaimResult{}, err
	}
	return g.Store.Claim(ctx, req)
}

func (g *gateStore) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	if err := g.wait(ctx); err != nil {
		return err
	}
	return g.Store.Complete(ctx, id, tok, resp, ret)
}

func (g *gateStore) Release(ctx context.Context, id store.ID, tok store.Token) error {
	g.releases.Add(1)
	if err := g.wait(ctx); err != nil {
		return err
	}
	return g.Store.Release(ctx, id, tok)
}

func (g *gateStore) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	if err := g.wait(ctx); err != nil {
		return err
	}
	return g.Store.Renew(ctx, id, tok, lease)
}

// timedWriter is a ResponseWriter that notes the body written and flushed.
type timedWriter struct {
	h       http.Header
	code    int
	body    strings.Builder
	flushes int
}

func (w *timedWriter) Header() http.Header { return w.h }
func (w *timedWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *timedWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.body.Write(p)
}
func (w *timedWriter) Flush() { w.flushes++ }

// hungEnv is a middleware over a gateStore on the real clock (a synctest
// bubble's): lease 9 s, so a renewal is sent at 3 s, bounded by 3 s; complete
// and release bounded by 1 s. The handler runs for handlerTime (the store hangs
// from its start), then answers status with "part1" and, when chunked, a flush
// and "part2".
type hungEnv struct {
	st    *gateStore
	h     http.Handler
	runs  atomic.Int32
	evs   chan Event
	bound time.Duration
}

const handlerTime = 4 * time.Second

func newHungEnv(t *testing.T, status int, chunked bool) *hungEnv {
	e := &hungEnv{st: &gateStore{Store: memory.New()}, evs: make(chan Event, 8), bound: time.Second}
	m, err := New(e.st, GlobalScope, WithLease(9*time.Second), WithLogger(discardLogger()),
		WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: e.bound, Complete: e.bound, Release: e.bound}}),
		WithObserver(ObserverFunc(func(_ context.Context, ev Event) { e.evs <- ev })))
	if err != nil {
		t.Fatal(err)
	}
	e.h = m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e.runs.Add(1) == 1 {
			e.st.shut() // the store stops while the first run is in its handler
			time.Sleep(handlerTime)
		}
		w.WriteHeader(status)
		io.WriteString(w, "part1")
		if chunked {
			w.(http.Flusher).Flush()
			io.WriteString(w, "part2")
		}
	}))
	return e
}

// serve runs one request to its end and returns its answer and how long
// ServeHTTP took.
func (e *hungEnv) serve() (*timedWriter, time.Duration) {
	w := &timedWriter{h: http.Header{}}
	r := req("POST", "/charges", "k", "x")
	t0 := time.Now()
	e.h.ServeHTTP(w, r)
	return w, time.Since(t0)
}

// A store that hangs while the handler runs (a renewal in flight, then the
// completion) delays the client's answer by one store bound at most: the whole
// response (a chunked one too) is written and ServeHTTP returns within the
// handler's time plus the complete bound, the Event says completion goes on in
// the background, and once the store answers again the background completion
// stores the record (409 until then), which the retry replays.
func TestAnswerWhileCompleteHangs(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "chunked"}[chunked], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newHungEnv(t, http.StatusCreated, chunked)
				w, took := e.serve()
				want := "part1" + map[bool]string{false: "", true: "part2"}[chunked]
				if w.code != http.StatusCreated || w.body.String() != want || took > handlerTime+e.bound {
					t.Fatalf("answer %d %q after %v; want 201 %q within %v (handler %v + one store bound)",
						w.code, w.body.String(), took, want, handlerTime+e.bound, handlerTime)
				}
				ev := <-e.evs
				if ev.Decision != Executed || !ev.CompletionPending || ev.Err == nil {
					t.Fatalf("event %+v; want executed, completion pending after the failed attempt", ev)
				}
				e.st.open() // the store answers again
				if w, _ := e.serve(); w.code != http.StatusConflict {
					t.Fatalf("duplicate while the completion is retried: %d %q, want 409", w.code, w.body.String())
				}
				<-e.evs
				time.Sleep(time.Second) // the background retry's back-off passes
				synctest.Wait()
				w, _ = e.serve()
				if w.code != http.StatusCreated || w.body.String() != want || w.h.Get(DefaultReplayedHeader) != "true" || e.runs.Load() != 1 {
					t.Fatalf("retry after the store came back: %d %q replayed=%q, %d runs; want the replay, 1 run",
						w.code, w.body.String(), w.h.Get(DefaultReplayedHeader), e.runs.Load())
				}
			})
		})
	}
}

// A response the claim is released for (a 5xx), while the store hangs, reaches
// the client within the handler's time plus the release bound; the release goes
// on in the background, fenced by the token: once the store answers, the key is
// free (the retry runs), but a release that lands after another request took the
// expired key over leaves the new holder's claim alone.
func TestAnswerWhileReleaseHangs(t *testing.T) {
	for _, takeover := range []bool{false, true} {
		t.Run(map[bool]string{false: "released", true: "fenced"}[takeover], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newHungEnv(t, http.StatusServiceUnavailable, false)
				w, took := e.serve()
				if w.code != http.StatusServiceUnavailable || w.body.String() != "part1" || took > handlerTime+e.bound {
					t.Fatalf("answer %d %q after %v; want 503 within %v (handler %v + one store bound)",
						w.code, w.body.String(), took, handlerTime+e.bound, handlerTime)
				}
				if ev := <-e.evs; ev.Decision != Released || ev.Err == nil {
					t.Fatalf("event %+v; want released, with the failed attempt's error", ev)
				}
				if !takeover {
					e.st.open()
					time.Sleep(time.Second) // the background release's back-off passes
					synctest.Wait()
					if w, _ := e.serve(); w.code != http.StatusServiceUnavailable || e.runs.Load() != 2 {
						t.Fatalf("retry after the background release: %d, %d runs; want a second run", w.code, e.runs.Load())
					}
					<-e.evs
					return
				}
				// The lease (9 s from the claim; no renewal reached the store) runs out
				// while the store hangs; another holder takes the key over.
				time.Sleep(9 * time.Second)
				id := store.ID{Scope: "", Key: "k"}
				fp, _ := fingerprint.Sum(fingerprint.Request{Method: "POST", Route: "/charges", Body: []byte("x")}, fingerprint.Options{})
				res, err := e.st.Store.Claim(context.Background(), store.ClaimRequest{ID: id, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour})
				if err != nil || res.Outcome != store.Claimed || !res.Takeover {
					t.Fatalf("takeover: %+v %v", res, err)
				}
				before := e.st.releases.Load()
				e.st.open()
				for e.st.releases.Load() == before { // the background release reaches the store
					time.Sleep(100 * time.Millisecond)
				}
				synctest.Wait()
				if w, _ := e.serve(); w.code != http.StatusConflict || e.runs.Load() != 1 {
					t.Fatalf("retry after a fenced background release: %d, %d runs; want 409 (the new holder's claim)", w.code, e.runs.Load())
				}
				<-e.evs
			})
		})
	}
}

// has reports whether a record whose message contains msg was logged.
func (l *logRecorder) has(msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.records {
		if strings.Contains(r.Message, msg) {
			return true
		}
	}
	return false
}

// With the default store bounds (5 s, longer than the answer grace of package
// claim), a store that hangs once the handler is running delays the client's
// answer by the grace at most, never by a release or completion bound: the
// call goes on in the background, fenced by the token (issue 32 item 11). On
// the stored and the released path alike; once the store answers again the
// key is completed (the retry replays) or free (the retry runs).
func TestAnswerNotDelayedByHungStore(t *testing.T) {
	const grace = time.Second // claim's answerGrace
	for _, status := range []int{http.StatusCreated, http.StatusServiceUnavailable} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := &hungEnv{st: &gateStore{Store: memory.New()}, evs: make(chan Event, 8)}
				m, err := New(e.st, GlobalScope, WithLease(30*time.Second), WithLogger(discardLogger()),
					WithObserver(ObserverFunc(func(_ context.Context, ev Event) { e.evs <- ev })))
				if err != nil {
					t.Fatal(err)
				}
				e.h = m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if e.runs.Add(1) == 1 {
						e.st.shut()
						time.Sleep(handlerTime)
					}
					w.WriteHeader(status)
					io.WriteString(w, "part1")
				}))
				w, took := e.serve()
				if w.code != status || took > handlerTime+grace {
					t.Fatalf("answer %d after %v; want %d within %v (the handler, then the grace; the store bound is %v)",
						w.code, took, status, handlerTime+grace, claim.DefaultStoreTimeout)
				}
				if ev := <-e.evs; status < 500 && !ev.CompletionPending || status >= 500 && (ev.Decision != Released || ev.Err != nil) {
					t.Fatalf("event %+v; want the store call going on in the background", ev)
				}
				e.st.open()
				synctest.Wait()
				time.Sleep(time.Second) // a background retry's back-off, if any
				synctest.Wait()
				w, _ = e.serve()
				<-e.evs
				wantRuns := int32(1)
				if status >= 500 {
					wantRuns = 2
				}
				if w.code != status || e.runs.Load() != wantRuns {
					t.Fatalf("retry: %d after %d runs; want %d after %d", w.code, e.runs.Load(), status, wantRuns)
				}
				if err := m.Wait(t.Context()); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}
