package encrypted_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
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
