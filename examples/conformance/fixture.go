package main

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/middleware"
)

// Limits that keep the fixture from being turned against its host.
const (
	maxSlow  = time.Minute
	maxLarge = 64 << 20
)

// fixture is the conformance app of docs/conformance.md: every POST adds
// one to a process-wide counter, and /reset forgets the counter and every key.
type fixture struct {
	count atomic.Int64
	// forget deletes every record of the persistent store the fixture shares
	// with any other on it (a restarted fixture, a second instance), so a reset
	// on one forgets the keys for all and they keep sharing the keys stored
	// after it. Nil for the memory store, whose records die with the process:
	// there a reset moves to the next generation, which prefixes every scope.
	forget forgetFunc
	// generation prefixes every scope; it stays 0 on a persistent store.
	generation atomic.Uint64
	// client is the X-Client-ID part of the scope ("anonymous" when absent).
	client middleware.ScopeFunc
}

func makeFixture(forget forgetFunc) *fixture {
	return &fixture{forget: forget, client: middleware.ScopeFromHeader("X-Client-ID", "anonymous")}
}

// routes returns the routes that sit behind the idempotency middleware.
func (f *fixture) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /echo", f.echo)
	mux.HandleFunc("POST /status/{code}", f.status)
	mux.HandleFunc("POST /slow", f.slow)
	mux.HandleFunc("POST /large", f.large)
	mux.HandleFunc("GET /counter", f.counter)
	return mux
}

func (f *fixture) echo(w http.ResponseWriter, r *http.Request) {
	var body bytes.Buffer
	if _, err := body.ReadFrom(r.Body); err != nil {
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	f.count.Add(1)
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusCreated)
	w.Write(body.Bytes())
}

func (f *fixture) status(w http.ResponseWriter, r *http.Request) {
	code, err := strconv.Atoi(r.PathValue("code"))
	if err != nil || code < 200 || code > 599 {
		http.Error(w, "status must be a number from 200 to 599", http.StatusBadRequest)
		return
	}
	f.count.Add(1)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	fmt.Fprintf(w, "status:%d", code)
}

func (f *fixture) slow(w http.ResponseWriter, r *http.Request) {
	ms, err := strconv.Atoi(r.URL.Query().Get("ms"))
	if err != nil || ms < 0 || time.Duration(ms)*time.Millisecond > maxSlow {
		http.Error(w, "ms must be a number of milliseconds from 0 to 60000", http.StatusBadRequest)
		return
	}
	f.count.Add(1)
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "slept:%d", ms)
}

func (f *fixture) large(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.Atoi(r.URL.Query().Get("bytes"))
	if err != nil || n < 0 || n > maxLarge {
		http.Error(w, fmt.Sprintf("bytes must be a number from 0 to %d", maxLarge), http.StatusBadRequest)
		return
	}
	f.count.Add(1)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(n))
	chunk := bytes.Repeat([]byte{'x'}, min(n, 32<<10))
	for n > 0 {
		k := min(n, len(chunk))
		if _, err := w.Write(chunk[:k]); err != nil {
			return
		}
		n -= k
	}
}

func (f *fixture) counter(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"count": %d}`, f.count.Load())
}

// reset forgets every key (see fixture.forget) and sets the counter to 0. It
// answers 204, or 503 when the store cannot be cleared.
func (f *fixture) reset(w http.ResponseWriter, r *http.Request) {
	if f.forget == nil {
		f.generation.Add(1)
	} else if err := f.forget(r.Context()); err != nil {
		http.Error(w, "reset: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	f.count.Store(0)
	w.WriteHeader(http.StatusNoContent)
}

// scope is the idempotency scope: the reset generation (memory store) and the X-Client-ID header
// (a stand-in for an authenticated principal), "anonymous" when absent (a client
// sending "anonymous" gets a scope of its own, see middleware.ScopeFromHeader).
func (f *fixture) scope(r *http.Request) string {
	return strconv.FormatUint(f.generation.Load(), 16) + "/" + f.client(r)
}
