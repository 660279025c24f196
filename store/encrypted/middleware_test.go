package encrypted_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// TestMiddlewareFailsClosedOnTamperedRecord: through the middleware, a sealed
// answer replays byte for byte; once its stored bytes are changed, the retry
// is 503 and the handler does not run again.
func TestMiddlewareFailsClosedOnTamperedRecord(t *testing.T) {
	inner := memory.New()
	m, err := middleware.New(wrap(t, inner, newKey(t, "k1")), middleware.GlobalScope, middleware.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.Header().Set("X-Card-Token", "tok_4242424242")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"card":"4242424242424242"}`))
	}))
	send := func(key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/pay", strings.NewReader(`{"amountCents":100}`))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	first, again := send("k"), send("k")
	if again.Code != 201 || again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != first.Body.String() ||
		again.Header().Get("X-Card-Token") != "tok_4242424242" || runs != 1 {
		t.Fatalf("replay: %d %v %q, runs %d", again.Code, again.Header(), again.Body, runs)
	}

	// Change one byte of the stored body: complete a copy under a new key in
	// the wrapped store, then ask for that key through the middleware.
	info, err := inner.Inspect(ctx, store.ID{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	req := store.ClaimRequest{ID: store.ID{Key: "k"}, Fingerprint: info.Fingerprint, Lease: time.Minute, Retention: time.Hour}
	res, err := inner.Claim(ctx, req)
	if err != nil || res.Outcome != store.Completed {
		t.Fatal(res.Outcome, err)
	}
	changed := res.Record.Response
	changed.Body = bytes.Clone(changed.Body)
	changed.Body[0] ^= 0x20
	req.ID.Key = "changed"
	if res, err = inner.Claim(ctx, req); err != nil || res.Outcome != store.Claimed {
		t.Fatal(res.Outcome, err)
	}
	if err := inner.Complete(ctx, req.ID, res.Token, changed, time.Hour); err != nil {
		t.Fatal(err)
	}
	if w := send("changed"); w.Code != http.StatusServiceUnavailable || runs != 1 || strings.Contains(w.Body.String(), "4242") {
		t.Errorf("tampered record: %d %q, runs %d; want 503 and no run", w.Code, w.Body, runs)
	}
}

// benchHandler is the middleware over st (plain or sealed), answering 201
// with a body of n bytes, as a request through the whole HTTP path.
func benchHandler(b *testing.B, st store.Store, n int) http.Handler {
	m, err := middleware.New(st, middleware.GlobalScope)
	if err != nil {
		b.Fatal(err)
	}
	answer := secretResponse(n).Body
	return m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(answer)
	}))
}

func benchSend(b *testing.B, h http.Handler, key string) {
	r := httptest.NewRequest("POST", "/pay", strings.NewReader(`{"amountCents":100}`))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		b.Fatal(w.Code)
	}
}

// BenchmarkHTTP is the wrapper's cost on a whole request through the
// middleware over the memory store: first executions (a new key each time)
// and replays, plain and sealed, 128 B and 1 KiB answers.
func BenchmarkHTTP(b *testing.B) {
	for _, path := range []string{"execute", "replay"} {
		for _, n := range []int{128, 1024} {
			for _, name := range []string{"plain", "sealed"} {
				b.Run(fmt.Sprintf("%s/%s/%dB", path, name, n), func(b *testing.B) {
					h := benchHandler(b, benchStores(b)[name], n)
					benchSend(b, h, "k")
					b.ReportAllocs()
					i := 0
					for b.Loop() {
						key := "k"
						if path == "execute" {
							i++
							key = "k" + strconv.Itoa(i)
						}
						benchSend(b, h, key)
					}
				})
			}
		}
	}
}
