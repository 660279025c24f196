package postgres

import (
	"net/http"
	"testing"
	"time"
)

// TestOneTxFailClosedTakeover: a takeover (the claim's transaction holds the
// expired row's lock) whose handler aborts its transaction through the side
// door and answers 201 fails closed without waiting on its own lock: the 503
// comes at once, not after the completion bound, and the retry meets the key
// kept claimed for a lease (409), the handler run once.
func TestOneTxFailClosedTakeover(t *testing.T) {
	runs := 0
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if runs++; runs == 1 {
				w.WriteHeader(201)
				return
			}
			tx, _ := TxFromContext(r.Context())
			_, _ = tx.Conn().Exec(r.Context(), `SELECT 1/0`)
			w.WriteHeader(201)
		}
	}, nil)
	id := struct{ Key string }{Key: "failclosed-takeover"}
	if code, _, body, err := e.post(id.Key); err != nil || code != http.StatusCreated {
		t.Fatalf("first: %d %q %v", code, body, err)
	}
	// The record becomes a claim whose lease ended (its holder died): the next
	// request takes it over.
	if _, err := e.pool.Exec(t.Context(), `UPDATE `+e.st.Table()+` SET status = NULL, headers = NULL, body = NULL, completed_at = NULL, lease_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	code, _, body, err := e.post(id.Key)
	if took := time.Since(t0); err != nil || code != http.StatusServiceUnavailable || took > 2*time.Second {
		t.Fatalf("takeover that aborted through the side door: %d %q %v after %v; want 503 within 2 s", code, body, err, took)
	}
	if code, _, body, err := e.post(id.Key); err != nil || code != http.StatusConflict || runs != 2 {
		t.Fatalf("retry: %d %q %v after %d runs; want 409 (the key kept for its lease), 2 runs", code, body, err, runs)
	}
}
