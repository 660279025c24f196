package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/idemkey/idemkey/examples/internal/setup"
	"github.com/idemkey/idemkey/store/memory"
)

// The behaviours the conformance vectors check, in the project's own words, run
// in-process against the fixture with the memory store.

type fixtureClient struct {
	t *testing.T
	h http.Handler
}

func newFixture(t *testing.T, replayHeader string) *fixtureClient {
	t.Helper()
	env, err := setup.Load(func(k string) string {
		if k == "IDEM_REPLAY_HEADER" {
			return replayHeader
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHandler(env, memory.New(), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return &fixtureClient{t: t, h: h}
}

func (c *fixtureClient) do(method, path, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "text/plain")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	rec := httptest.NewRecorder()
	c.h.ServeHTTP(rec, req)
	return rec
}

func (c *fixtureClient) count() int {
	rec := c.do("GET", "/counter", "", "")
	var v struct{ Count int }
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		c.t.Fatalf("counter: %v %q", err, rec.Body)
	}
	return v.Count
}

func isProblem(rec *httptest.ResponseRecorder) bool {
	return strings.HasPrefix(rec.Header().Get("Content-Type"), "application/problem+json")
}

func TestFixtureBehaviours(t *testing.T) {
	t.Run("fresh key executes once and echoes", func(t *testing.T) {
		c := newFixture(t, "")
		rec := c.do("POST", "/echo", "k1", "hello")
		if rec.Code != 201 || rec.Body.String() != "hello" || c.count() != 1 {
			t.Fatalf("got %d %q count %d", rec.Code, rec.Body, c.count())
		}
	})
	t.Run("key on GET is ignored", func(t *testing.T) {
		c := newFixture(t, "")
		c.do("GET", "/counter", "g", "")
		c.do("POST", "/echo", "p", "x")
		rec := c.do("GET", "/counter", "g", "")
		if !strings.Contains(rec.Body.String(), `"count": 1`) {
			t.Fatalf("second GET replayed or miscounted: %q", rec.Body)
		}
	})
	t.Run("missing key is a 400 problem and runs nothing", func(t *testing.T) {
		c := newFixture(t, "")
		rec := c.do("POST", "/echo", "", "no key")
		if rec.Code != 400 || !isProblem(rec) || c.count() != 0 {
			t.Fatalf("got %d %q count %d", rec.Code, rec.Header().Get("Content-Type"), c.count())
		}
	})
	t.Run("other payload is a 422 problem and does not poison", func(t *testing.T) {
		c := newFixture(t, "")
		first := c.do("POST", "/echo", "m", "payload-a")
		changed := c.do("POST", "/echo", "m", "payload-b")
		again := c.do("POST", "/echo", "m", "payload-a")
		if changed.Code != 422 || !isProblem(changed) {
			t.Fatalf("changed payload: %d %q", changed.Code, changed.Header().Get("Content-Type"))
		}
		if again.Code != 201 || !bytes.Equal(again.Body.Bytes(), first.Body.Bytes()) || c.count() != 1 {
			t.Fatalf("corrected retry: %d %q count %d", again.Code, again.Body, c.count())
		}
	})
	t.Run("the router's 405 and 404 do not spend the key", func(t *testing.T) {
		c := newFixture(t, "")
		if rec := c.do("PATCH", "/echo", "r", "hello"); rec.Code != 405 {
			t.Fatalf("PATCH /echo: %d", rec.Code)
		}
		if rec := c.do("POST", "/ech0", "r", "hello"); rec.Code != 404 {
			t.Fatalf("POST /ech0: %d", rec.Code)
		}
		if rec := c.do("POST", "/echo", "r", "hello"); rec.Code != 201 || rec.Body.String() != "hello" || c.count() != 1 {
			t.Fatalf("the corrected request: %d %q count %d, want 201", rec.Code, rec.Body, c.count())
		}
	})
	t.Run("quoted sf-string key deduplicates", func(t *testing.T) {
		c := newFixture(t, "")
		c.do("POST", "/echo", `"quoted-1"`, "q")
		rec := c.do("POST", "/echo", `"quoted-1"`, "q")
		if rec.Code != 201 || rec.Body.String() != "q" || c.count() != 1 {
			t.Fatalf("got %d %q count %d", rec.Code, rec.Body, c.count())
		}
	})
	t.Run("stored 4xx replays with the marker", func(t *testing.T) {
		c := newFixture(t, "Idempotency-Replayed")
		first := c.do("POST", "/status/404", "s", "s")
		retry := c.do("POST", "/status/404", "s", "s")
		if first.Header().Get("Idempotency-Replayed") != "" {
			t.Fatal("original marked as a replay")
		}
		if retry.Code != 404 || retry.Body.String() != "status:404" || retry.Header().Get("Idempotency-Replayed") != "true" || c.count() != 1 {
			t.Fatalf("retry: %d %q %v count %d", retry.Code, retry.Body, retry.Header(), c.count())
		}
	})
	t.Run("body over the cap replays empty and marked omitted", func(t *testing.T) {
		c := newFixture(t, "Idempotency-Replayed")
		first := c.do("POST", "/large?bytes=1048577", "l", "l")
		retry := c.do("POST", "/large?bytes=1048577", "l", "l")
		if first.Body.Len() != 1048577 {
			t.Fatalf("original streamed %d bytes", first.Body.Len())
		}
		if retry.Code != 200 || retry.Body.Len() != 0 || retry.Header().Get("Idempotency-Replay") != "omitted" || c.count() != 1 {
			t.Fatalf("retry: %d %d bytes %v count %d", retry.Code, retry.Body.Len(), retry.Header(), c.count())
		}
	})
	t.Run("duplicate during the original is a 409 problem", func(t *testing.T) {
		c := newFixture(t, "")
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() {
			req := httptest.NewRequestWithContext(ctx, "POST", "/slow?ms=60000", strings.NewReader("slow"))
			req.Header.Set("Content-Type", "text/plain") // as c.do: the media type counts
			req.Header.Set("Idempotency-Key", "c")
			c.h.ServeHTTP(httptest.NewRecorder(), req)
		})
		for c.count() == 0 { // the counter moves once the original holds the claim
			runtime.Gosched()
		}
		dup := c.do("POST", "/slow?ms=60000", "c", "slow")
		cancel()
		wg.Wait()
		if dup.Code != 409 || !isProblem(dup) || dup.Header().Get("Retry-After") == "" {
			t.Fatalf("duplicate: %d %v", dup.Code, dup.Header())
		}
		if c.count() != 1 {
			t.Fatalf("handler ran %d times", c.count())
		}
	})
	t.Run("client hanging up on /slow does not run it twice", func(t *testing.T) {
		// The handler's context is not cancelled by the hang-up: /slow finishes, its
		// response is stored, and the retry replays it (the counter stays 1).
		c := newFixture(t, "")
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() {
			req := httptest.NewRequestWithContext(ctx, "POST", "/slow?ms=300", strings.NewReader("slow"))
			req.Header.Set("Content-Type", "text/plain") // as c.do: the media type counts
			req.Header.Set("Idempotency-Key", "gone")
			c.h.ServeHTTP(httptest.NewRecorder(), req)
		})
		for c.count() == 0 {
			runtime.Gosched()
		}
		cancel()
		wg.Wait()
		retry := c.do("POST", "/slow?ms=300", "gone", "slow")
		if retry.Code != 200 || retry.Body.String() != "slept:300" || retry.Header().Get("Idempotent-Replayed") != "true" || c.count() != 1 {
			t.Fatalf("retry after hang-up: %d %q count %d", retry.Code, retry.Body, c.count())
		}
	})
}
