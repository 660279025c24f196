package middleware

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/store"
)

// A handler whose lease was lost (its context cancelled with cause
// store.ErrLeaseLost) that keeps writing its answer is not stored: retries
// replay the answer of the request that took the key over. The state the
// middleware pools is not carried into the next request: its context is live,
// it holds its own claim, and its answer is stored.
func TestLostLeaseHandlerKeepsWriting(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	type seen struct {
		ctx   context.Context
		claim claim.Claim
		ok    bool
	}
	ctxs := make(chan seen, 2)
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		cl, ok := claim.FromContext(r.Context())
		ctxs <- seen{r.Context(), cl, ok}
		if string(b) == "first" {
			entered <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "late:"+string(b)) // written after the context was cancelled
	})
	done := make(chan int)
	go func() { done <- e.do(req("POST", "/x", "k", "first")).Code }()
	<-entered
	first := <-ctxs
	e.now.Add(claim.DefaultLease + time.Second)
	fp, _ := fingerprint.Sum(fingerprint.Request{Method: "POST", Route: "/x", Body: []byte("first")}, fingerprint.Options{})
	id := store.ID{Scope: "anonymous", Key: "k"}
	res, err := e.mem.Claim(context.Background(), store.ClaimRequest{ID: id, Fingerprint: fp, Lease: claim.DefaultLease, Retention: claim.DefaultRetention})
	if err != nil || !res.Takeover {
		t.Fatalf("takeover %+v %v", res, err)
	}
	e.clk.fire()
	if !errors.Is(context.Cause(first.ctx), store.ErrLeaseLost) {
		t.Fatalf("cause %v, want store.ErrLeaseLost", context.Cause(first.ctx))
	}
	if err := e.mem.Complete(context.Background(), id, res.Token, store.Response{Status: 201, Body: []byte("theirs")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	close(release)
	if code := <-done; code != http.StatusCreated {
		t.Fatalf("the stale holder's client got %d", code)
	}
	if ev := e.lastEvent(); ev.Decision != LeaseLost {
		t.Fatalf("decision %v, want LeaseLost", ev.Decision)
	}
	if w := e.do(req("POST", "/x", "k", "first")); w.Body.String() != "theirs" || w.Header().Get(DefaultReplayedHeader) != "true" {
		t.Fatalf("retry: %d %q, want the takeover's replay", w.Code, w.Body)
	}
	for i := range 3 { // a pooled call, if any, serves these
		key := string(rune('a' + i))
		w := e.do(req("POST", "/x", key, "next"))
		next := <-ctxs
		if next.ctx.Err() != nil || !next.ok || next.claim.ID.Key != key || next.claim.Token == res.Token || w.Body.String() != "late:next" {
			t.Fatalf("next request %q: ctx %v, claim %+v %v, answer %q", key, next.ctx.Err(), next.claim, next.ok, w.Body)
		}
		if r := e.do(req("POST", "/x", key, "next")); r.Header().Get(DefaultReplayedHeader) != "true" || r.Body.String() != "late:next" {
			t.Fatalf("replay of %q: %q", key, r.Body)
		}
	}
}
