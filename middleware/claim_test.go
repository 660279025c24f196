package middleware

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// notifyStore counts the middleware's calls and records NotifyCompleted.
type notifyStore struct {
	hookStore
	mu       sync.Mutex
	notified []store.Response
}

func (n *notifyStore) NotifyCompleted(_ context.Context, _ store.ID, _ store.Token, resp store.Response, _ time.Duration) {
	n.mu.Lock()
	n.notified = append(n.notified, resp)
	n.mu.Unlock()
}

// TestMarkCompleted: a handler that completes the record itself (as in its own
// transaction) and says so is not completed again nor released, whatever it
// writes; its claim is in the context; a store that caches records is told; the
// retry replays the committed record.
func TestMarkCompleted(t *testing.T) {
	mem := memory.New()
	ns := &notifyStore{hookStore: hookStore{Store: mem}}
	var (
		leaked context.Context
		cl     claim.Claim
		calls  int
		events []Event
	)
	m, err := New(ns, GlobalScope, WithRecordRetention(policy.RetentionRule{Default: time.Hour}), WithClock(&fakeClock{}), WithLogger(discardLogger()),
		WithObserver(ObserverFunc(func(_ context.Context, ev Event) { events = append(events, ev) })))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		ctx := r.Context()
		var ok bool
		if cl, ok = claim.FromContext(ctx); !ok {
			t.Error("no claim in the handler's context")
			return
		}
		resp := store.Response{Status: 201, Body: []byte("committed")}
		// What CompleteTx and the commit do, here on the memory store itself.
		if err := mem.Complete(ctx, cl.ID, cl.Token, resp, cl.Retention); err != nil {
			t.Error(err)
		}
		if err := claim.MarkCompleted(ctx, resp); err != nil {
			t.Error(err)
		}
		leaked = ctx
		w.WriteHeader(http.StatusInternalServerError) // not released: the record is committed
		w.Write([]byte("something else"))
	}))
	do := func() *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req("POST", "/x", "k", "b"))
		return w
	}
	if w := do(); w.Code != 500 || w.Body.String() != "something else" {
		t.Fatalf("first: %d %q", w.Code, w.Body)
	}
	if ev := events[0]; ev.Decision != Executed || !ev.InTransaction || ns.completes.Load() != 0 || ns.releases.Load() != 0 {
		t.Fatalf("event %+v, %d Complete, %d Release; want executed in transaction, none", ev, ns.completes.Load(), ns.releases.Load())
	}
	if len(ns.notified) != 1 || string(ns.notified[0].Body) != "committed" {
		t.Fatalf("notified %+v", ns.notified)
	}
	if w := do(); w.Code != 201 || w.Body.String() != "committed" || calls != 1 {
		t.Fatalf("retry: %d %q after %d calls; want the committed record", w.Code, w.Body, calls)
	}
	if cl.ID.Key != "k" || cl.Token.IsZero() || cl.Retention != time.Hour || cl.Takeover || cl.Fingerprint == (store.Fingerprint{}) {
		t.Fatalf("claim %+v", cl)
	}
	if err := claim.MarkCompleted(leaked, store.Response{Status: 200}); !errors.Is(err, claim.ErrNoClaim) {
		t.Fatalf("claim.MarkCompleted after the handler returned: %v", err)
	}
	if _, ok := claim.FromContext(context.Background()); ok {
		t.Fatal("claim in a bare context")
	}
	if err := claim.MarkCompleted(context.Background(), store.Response{Status: 200}); !errors.Is(err, claim.ErrNoClaim) {
		t.Fatalf("claim.MarkCompleted without a claim: %v", err)
	}
}

// TestMarkCompletedLateFromLeftoverGoroutine: a goroutine the handler left behind
// calls claim.MarkCompleted after the handler returned, while later requests reuse the
// pooled state: it gets claim.ErrNoClaim, never marks another request's claim, and the
// race detector sees no unsynchronised access.
func TestMarkCompletedLateFromLeftoverGoroutine(t *testing.T) {
	m, err := New(memory.New(), GlobalScope, WithClock(&fakeClock{}), WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	var late sync.WaitGroup
	release := make(chan struct{})
	lateErrs := make(chan error, 1)
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Leave") != "" {
			ctx := r.Context()
			late.Add(1)
			go func() {
				defer late.Done()
				<-release
				lateErrs <- claim.MarkCompleted(ctx, store.Response{Status: 299})
			}()
		}
		w.WriteHeader(http.StatusCreated)
	}))
	send := func(key string, leave bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/", nil)
		req.Header.Set("Idempotency-Key", key)
		if leave {
			req.Header.Set("X-Leave", "1")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	send("first", true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 50 {
			if w := send("next-"+string(rune('a'+i%26))+string(rune('a'+i/26)), false); w.Code != http.StatusCreated {
				t.Errorf("request %d: status %d", i, w.Code)
			}
		}
	}()
	close(release)
	late.Wait()
	<-done
	if err := <-lateErrs; !errors.Is(err, claim.ErrNoClaim) {
		t.Errorf("late claim.MarkCompleted = %v, want claim.ErrNoClaim", err)
	}
	// No later request was marked: each one stored its own 201.
	if w := send("next-aa", false); w.Code != http.StatusCreated || w.Header().Get(DefaultReplayedHeader) != "true" {
		t.Errorf("replay of a later request: %d %q", w.Code, w.Header().Get(DefaultReplayedHeader))
	}
}

// TestMarkCompletedThenPanic: a handler that panics after completing the record in
// its own transaction (claim.MarkCompleted) has a committed record: the middleware does
// not try to release it, reports it executed in the transaction, tells a store
// that caches records (so a cache's in-flight marker does not outlive the
// commit), re-panics, and the retry replays the committed record.
func TestMarkCompletedThenPanic(t *testing.T) {
	mem := memory.New()
	ns := &notifyStore{hookStore: hookStore{Store: mem}}
	var events []Event
	m, err := New(ns, GlobalScope, WithClock(&fakeClock{}), WithLogger(discardLogger()),
		WithObserver(ObserverFunc(func(_ context.Context, ev Event) { events = append(events, ev) })))
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		cl, _ := claim.FromContext(r.Context())
		resp := store.Response{Status: 201, Body: []byte("committed")}
		if err := mem.Complete(r.Context(), cl.ID, cl.Token, resp, cl.Retention); err != nil {
			t.Error(err)
		}
		if err := claim.MarkCompleted(r.Context(), resp); err != nil {
			t.Error(err)
		}
		panic("after commit")
	}))
	func() {
		defer func() {
			if p := recover(); p != "after commit" {
				t.Fatalf("recovered %v, want the handler's panic", p)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), req("POST", "/x", "k", "b"))
	}()
	if len(events) != 1 || events[0].Decision != Executed || !events[0].InTransaction || events[0].Err != nil {
		t.Fatalf("events %+v; want one, executed in transaction", events)
	}
	if ns.releases.Load() != 0 || ns.completes.Load() != 0 || len(ns.notified) != 1 || string(ns.notified[0].Body) != "committed" {
		t.Fatalf("%d Release, %d Complete, notified %+v; want none, none, the committed response",
			ns.releases.Load(), ns.completes.Load(), ns.notified)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req("POST", "/x", "k", "b"))
	if w.Code != 201 || w.Body.String() != "committed" || calls != 1 {
		t.Fatalf("retry: %d %q after %d calls; want the committed record", w.Code, w.Body, calls)
	}
}

// TestMarkCompletedNeverReleases: after claim.MarkCompleted nothing the handler does
// (a 5xx body over the storage cap, a 101, a hijack) makes the middleware try to
// release the committed record.
func TestMarkCompletedNeverReleases(t *testing.T) {
	for name, after := range map[string]func(w http.ResponseWriter){
		"5xx over the cap": func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusBadGateway)
			w.Write([]byte("longer than the cap"))
		},
		"101": func(w http.ResponseWriter) { w.WriteHeader(http.StatusSwitchingProtocols) },
		"hijack": func(w http.ResponseWriter) {
			if _, _, err := http.NewResponseController(w).Hijack(); err == nil {
				t.Error("the recorder cannot be hijacked")
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			mem := memory.New()
			ns := &notifyStore{hookStore: hookStore{Store: mem}}
			var events []Event
			m, err := New(ns, GlobalScope, WithClock(&fakeClock{}), WithLogger(discardLogger()), WithReplay(ReplayRule{MaxBody: 4}),
				WithObserver(ObserverFunc(func(_ context.Context, ev Event) { events = append(events, ev) })))
			if err != nil {
				t.Fatal(err)
			}
			h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				cl, _ := claim.FromContext(r.Context())
				resp := store.Response{Status: 201}
				if err := mem.Complete(r.Context(), cl.ID, cl.Token, resp, cl.Retention); err != nil {
					t.Error(err)
				}
				if err := claim.MarkCompleted(r.Context(), resp); err != nil {
					t.Error(err)
				}
				after(w)
			}))
			h.ServeHTTP(httptest.NewRecorder(), req("POST", "/x", "k", "b"))
			if ns.releases.Load() != 0 || len(events) != 1 || !events[0].InTransaction || events[0].Err != nil {
				t.Fatalf("%d Release calls, events %+v; want none, executed in transaction", ns.releases.Load(), events)
			}
		})
	}
}

// deadlineStore records how much time each store call had left (0: no deadline).
type deadlineStore struct {
	store.Store
	mu   sync.Mutex
	left map[string]time.Duration
}

func (d *deadlineStore) record(ctx context.Context, op string) {
	var left time.Duration
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	d.mu.Lock()
	d.left[op] = left
	d.mu.Unlock()
}

func (d *deadlineStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	d.record(ctx, "claim")
	return d.Store.Claim(ctx, req)
}

func (d *deadlineStore) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	d.record(ctx, "complete")
	return d.Store.Complete(ctx, id, tok, resp, ret)
}

func (d *deadlineStore) Release(ctx context.Context, id store.ID, tok store.Token) error {
	d.record(ctx, "release")
	return d.Store.Release(ctx, id, tok)
}

func (d *deadlineStore) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	d.record(ctx, "renew")
	return d.Store.Renew(ctx, id, tok, lease)
}

// inProcessStore is a deadlineStore that says it never waits on I/O.
type inProcessStore struct{ *deadlineStore }

func (inProcessStore) InProcess() bool { return true }

// Every store call runs under its bound: a zero claim.Timeouts field takes its
// default (claim.DefaultStoreTimeout; a third of the lease, at most that, for Renew),
// a set one is used as given, and an in-process store's calls have no deadline.
func TestStoreTimeouts(t *testing.T) {
	const d = claim.DefaultStoreTimeout
	tests := []struct {
		name      string
		inProcess bool
		opts      []Option
		want      map[string]time.Duration
	}{
		{"defaults", false, nil, map[string]time.Duration{"claim": d, "complete": d, "release": d, "renew": d}},
		{"zero fields", false, []Option{WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{}})}, map[string]time.Duration{"claim": d, "complete": d, "release": d, "renew": d}},
		{"short lease", false, []Option{WithLease(3 * time.Second)}, map[string]time.Duration{"claim": d, "complete": d, "release": d, "renew": time.Second}},
		{"some set", false, []Option{WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: time.Second, Renew: 2 * time.Second}})},
			map[string]time.Duration{"claim": time.Second, "complete": d, "release": d, "renew": 2 * time.Second}},
		{"in process", true, []Option{WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: time.Second}})},
			map[string]time.Duration{"claim": 0, "complete": 0, "release": 0, "renew": 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds := &deadlineStore{Store: memory.New(), left: map[string]time.Duration{}}
			var st store.Store = ds
			if tt.inProcess {
				st = inProcessStore{ds}
			}
			clk := &fakeClock{}
			m, err := New(st, GlobalScope, append([]Option{WithClock(clk), WithLogger(discardLogger())}, tt.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				clk.fire() // a renewal, on this goroutine
				if r.Header.Get("X-Fail") != "" {
					w.WriteHeader(http.StatusInternalServerError) // released
				}
			}))
			h.ServeHTTP(httptest.NewRecorder(), req("POST", "/x", "ok", "b"))
			h.ServeHTTP(httptest.NewRecorder(), req("POST", "/x", "fail", "b", "X-Fail", "1"))
			for op, want := range tt.want {
				got, ok := ds.left[op]
				switch {
				case !ok:
					t.Errorf("%s: not called", op)
				case want == 0 && got != 0:
					t.Errorf("%s: deadline %v away, want none", op, got)
				case want != 0 && (got > want || got < want/2):
					t.Errorf("%s: deadline %v away, want %v", op, got, want)
				}
			}
		})
	}
}
