package middleware

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// TestLeftoverGoroutinesNeverTouchOtherKeys runs many requests at once on the
// real clock (synctest's: renewals and the first-renewal sweeps run), a lease of
// claim.MinLease and handlers up to one and a half leases long, while
// goroutines the handlers left behind call claim.MarkCompleted, claim.SetRetention and
// claim.FromContext after their request ended, when its pooled state runs other
// keys. Every late claim.MarkCompleted and claim.SetRetention is refused, and every key ends
// with its own response stored (a late claim.MarkCompleted that marked another key's
// execution would leave that key unstored, in flight, answered 409).
func TestLeftoverGoroutinesNeverTouchOtherKeys(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { leftoverStress(t, seed) })
		})
	}
}

func leftoverStress(t *testing.T, seed uint64) {
	const (
		workers = 8
		each    = 40
	)
	mem := memory.New()
	m, err := New(mem, GlobalScope, WithLease(100*time.Millisecond), WithRecordRetention(policy.RetentionRule{Default: time.Hour}), WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	var late sync.WaitGroup
	var runs counter
	lateErr := make(chan error, workers*each*2)
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rng := rand.New(rand.NewPCG(seed, uint64(len(r.Header.Get("Idempotency-Key")))*7919+uint64(r.ContentLength)))
		key := r.Header.Get("Idempotency-Key")
		status, _ := strconv.Atoi(r.Header.Get("X-Status"))
		ended := r.Context().Value(endedKey{}).(chan struct{})
		ctx := r.Context()
		late.Add(1)
		go func() {
			defer late.Done()
			<-ended // the request has ended: its call may run another key now
			time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
			lateErr <- claim.MarkCompleted(ctx, store.Response{Status: 299, Body: []byte("late " + key)})
			lateErr <- claim.SetRetention(ctx, time.Minute)
			claim.FromContext(ctx)
		}()
		runs.Add(key)
		time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		if key[len(key)-1] == '5' { // completes the record itself, as in its own transaction
			cl, _ := claim.FromContext(ctx)
			resp := store.Response{Status: status, Body: []byte(key)}
			if err := mem.Complete(ctx, cl.ID, cl.Token, resp, cl.Retention); err != nil {
				t.Errorf("%s: complete in the handler: %v", key, err)
			}
			if err := claim.MarkCompleted(ctx, resp); err != nil {
				t.Errorf("%s: claim.MarkCompleted in the handler: %v", key, err)
			}
		}
		w.WriteHeader(status)
		fmt.Fprint(w, key)
	}))
	// A duplicate of each request, sent while it runs, is refused (409), or
	// replayed once it has ended: never run a second time.
	dup := func(key string, status int) {
		ended := make(chan struct{})
		r := httptest.NewRequest("POST", "/", nil)
		r = r.WithContext(contextWithEnded(r.Context(), ended))
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("X-Status", strconv.Itoa(status))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		close(ended)
		if w.Code != http.StatusConflict && (w.Code != status || w.Header().Get(DefaultReplayedHeader) != "true") {
			t.Errorf("duplicate of %s: %d replayed %q", key, w.Code, w.Header().Get(DefaultReplayedHeader))
		}
	}
	var wg sync.WaitGroup
	for wk := range workers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("k%d-%d", wk, i)
				ended := make(chan struct{})
				r := httptest.NewRequest("POST", "/", nil)
				r = r.WithContext(contextWithEnded(r.Context(), ended))
				r.Header.Set("Idempotency-Key", key)
				r.Header.Set("X-Status", strconv.Itoa(200+(wk+i)%4))
				w := httptest.NewRecorder()
				late.Add(1)
				go func() {
					defer late.Done()
					// After the request's claim: the bubble's time moves only
					// once every goroutine waits, and the request first waits in
					// its handler.
					time.Sleep(time.Duration(1+i*37%140) * time.Millisecond)
					dup(key, 200+(wk+i)%4)
				}()
				h.ServeHTTP(w, r)
				close(ended)
				if w.Code != 200+(wk+i)%4 || w.Body.String() != key {
					t.Errorf("%s: %d %q", key, w.Code, w.Body)
				}
			}
		})
	}
	wg.Wait()
	late.Wait()
	close(lateErr)
	for err := range lateErr {
		if !errors.Is(err, claim.ErrNoClaim) {
			t.Errorf("late call after the request ended: %v, want claim.ErrNoClaim", err)
		}
	}
	// Every key replays its own response (none was marked completed by another
	// request's leftover goroutine, none left in flight).
	for wk := range workers {
		for i := range each {
			key := fmt.Sprintf("k%d-%d", wk, i)
			r := httptest.NewRequest("POST", "/", nil)
			r.Header.Set("Idempotency-Key", key)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != 200+(wk+i)%4 || w.Body.String() != key || w.Header().Get(DefaultReplayedHeader) != "true" {
				t.Errorf("replay of %s: %d %q replayed %q", key, w.Code, w.Body, w.Header().Get(DefaultReplayedHeader))
			}
		}
	}
	if n := runs.max(); n != 1 {
		t.Errorf("a key ran %d times", n)
	}
	if err := m.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
}

type endedKey struct{}

func contextWithEnded(ctx context.Context, ended chan struct{}) context.Context {
	return context.WithValue(ctx, endedKey{}, ended)
}

// counter counts runs per key.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) Add(key string) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
	c.mu.Unlock()
}

func (c *counter) max() (m int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.n {
		m = max(m, n)
	}
	return m
}
