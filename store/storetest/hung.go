package storetest

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// HungWhileHandlerRuns checks, through the middleware over a real server, that
// a store that stops while a request is in its handler (pause: a SIGSTOP) delays
// the client's answer by one store bound at most: the handler's whole chunked
// response arrives within the complete bound (500 ms) plus 1.5 s of slack, not
// after completion retries lasting a lease (6 s). The completion then goes on in
// the background: after resume (SIGCONT) a duplicate gets 409 until it is
// stored, then the replay, and the handler ran once. The server must answer
// before pause. The test takes about 3 s.
func HungWhileHandlerRuns(t *testing.T, st store.Store, pause, resume func()) {
	t.Helper()
	const lease, bound, slack = 6 * time.Second, 500 * time.Millisecond, 1500 * time.Millisecond
	h := newHungServer(t, st, lease, bound)
	defer h.srv.Close()
	if a := h.post(t, "warm", false); a.code != 200 { // connections open and idle
		t.Fatalf("warm-up: %d", a.code)
	}
	first := make(chan hungAnswer, 1)
	go func() { first <- h.post(t, "hung", true) }()
	<-h.entered
	pause()
	paused := true
	defer func() {
		if paused {
			resume()
		}
	}()
	t0 := time.Now()
	close(h.proceed)
	a := <-first
	took := time.Since(t0)
	if a.code != 200 || a.body != "charged!" || took > bound+slack {
		t.Fatalf("answer %d %q after %v with the store stopped; want 200 %q within %v (one store bound %v + slack)",
			a.code, a.body, took, "charged!", bound+slack, bound)
	}
	ev := <-h.events
	if !ev.CompletionPending || ev.Err == nil {
		t.Fatalf("event %+v; want the completion pending after its failed attempt", ev)
	}
	time.Sleep(time.Second) // the outage lasts: background retries time out meanwhile
	resume()
	paused = false
	resumed := time.Now()
	codes := h.retryUntilReplayed(t, lease)
	t.Logf("store stopped in the handler: answer after %v (bound %v); replay %v after the resume (answers before: %v)",
		took, bound, time.Since(resumed), codes)
}

// hungServer is HungWhileHandlerRuns's middleware over the store, served over
// HTTP. Its handler counts its runs and writes a chunked "charged!"; a request
// with the X-Block header signals entered and waits for proceed to be closed.
// events receives the middleware's Executed events of the key "hung".
type hungServer struct {
	srv              *httptest.Server
	runs             atomic.Int32
	entered, proceed chan struct{}
	events           chan middleware.Event
}

func newHungServer(t *testing.T, st store.Store, lease, bound time.Duration) *hungServer {
	t.Helper()
	h := &hungServer{entered: make(chan struct{}), proceed: make(chan struct{}), events: make(chan middleware.Event, 16)}
	m, err := middleware.New(st, middleware.GlobalScope, middleware.WithLease(lease),
		middleware.WithLogger(slog.New(slog.DiscardHandler)),
		middleware.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: bound, Complete: bound, Release: bound}}),
		middleware.WithObserver(middleware.ObserverFunc(func(_ context.Context, ev middleware.Event) {
			if ev.ID.Key == "hung" && ev.Decision == middleware.Executed {
				h.events <- ev
			}
		})))
	if err != nil {
		t.Fatal(err)
	}
	h.srv = httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.runs.Add(1)
		if r.Header.Get("X-Block") != "" {
			h.entered <- struct{}{}
			<-h.proceed
		}
		io.WriteString(w, "charged")
		w.(http.Flusher).Flush() // chunked: the end of the body comes when ServeHTTP returns
		io.WriteString(w, "!")
	})))
	return h
}

type hungAnswer struct {
	code           int
	body, replayed string
}

// post sends a charge with the Idempotency-Key key; block makes the handler wait
// for proceed. It may run on another goroutine: a failed request is reported with
// t.Error and answers the zero hungAnswer.
func (h *hungServer) post(t *testing.T, key string, block bool) hungAnswer {
	r, _ := http.NewRequest("POST", h.srv.URL+"/charges", strings.NewReader("x"))
	r.Header.Set("Idempotency-Key", key)
	if block {
		r.Header.Set("X-Block", "1")
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(r)
	if err != nil {
		t.Error(err)
		return hungAnswer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return hungAnswer{resp.StatusCode, string(b), resp.Header.Get(middleware.DefaultReplayedHeader)}
}

// retryUntilReplayed retries the key "hung" at a client's pace until it is
// replayed, within a lease of now, with 409 or 503 answers before; it returns the
// count of each answer's status.
func (h *hungServer) retryUntilReplayed(t *testing.T, lease time.Duration) map[int]int {
	resumed := time.Now()
	codes := map[int]int{}
	for {
		d := h.post(t, "hung", false)
		codes[d.code]++
		if d.code == 200 {
			if d.body != "charged!" || d.replayed != "true" || h.runs.Load() != 2 {
				t.Fatalf("after the resume: %d %q replayed=%q, %d runs (warm-up included); want the replay, one run", d.code, d.body, d.replayed, h.runs.Load())
			}
			return codes
		}
		if d.code != http.StatusConflict && d.code != http.StatusServiceUnavailable || time.Since(resumed) > lease {
			t.Fatalf("after the resume: %d (answers so far %v); want 409 or 503 until the replay", d.code, codes)
		}
		time.Sleep(50 * time.Millisecond) // a client's retry pace
	}
}
