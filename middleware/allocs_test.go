package middleware

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/idemkey/idemkey/store/memory"
)

// TestAllocsMemoryStore pins what a request costs in allocations on the memory
// store: a first execution makes at most 6 (the execution, which holds the
// handler's request and its context, and is not pooled since a goroutine the
// handler leaves behind may keep it; the claim's context detached from the
// client's; the renewal timer and its function; the stored copy of the
// response; and the handler's own header value, which it makes without the
// middleware too; the record takes a slot of its shard's blocks, no allocation
// of its own), a replay none (a request context that cannot be cancelled needs
// no detached copy for the claim; its header values come from the call's
// chunk, one allocation per 64 values, and the record is built once). Only
// byte buffers are pooled.
func TestAllocsMemoryStore(t *testing.T) {
	if raceEnabled || testing.CoverMode() != "" {
		t.Skip("allocation counts do not hold under the race detector or coverage")
	}
	m, err := New(memory.New(), ScopeFromHeader("X-Client-ID", "anonymous"), WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(benchHandler)
	br, w := newBenchReq(), &discardWriter{h: http.Header{}}
	const runs = 1000
	keys := make([]string, runs+2)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	i := 0
	first := testing.AllocsPerRun(runs, func() {
		w.reset()
		h.ServeHTTP(w, br.next(keys[i]))
		i++
	})
	if w.code != http.StatusCreated || w.h.Get(DefaultReplayedHeader) != "" {
		t.Fatalf("first execution answered %d, replayed %q", w.code, w.h.Get(DefaultReplayedHeader))
	}
	if first > 6 {
		t.Errorf("a first execution makes %v allocations, want at most 6", first)
	}
	replay := testing.AllocsPerRun(runs, func() {
		w.reset()
		h.ServeHTTP(w, br.next(keys[0]))
	})
	if w.code != http.StatusCreated || w.h.Get(DefaultReplayedHeader) != "true" {
		t.Fatalf("replay answered %d, replayed %q", w.code, w.h.Get(DefaultReplayedHeader))
	}
	if replay > 0 {
		// The request's context cannot be cancelled (as Fiber's): the claim needs
		// no detached copy of it.
		t.Errorf("a replay makes %v allocations, want none", replay)
	}
}
