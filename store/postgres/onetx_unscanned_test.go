package postgres

import (
	"net/http"
	"testing"
	"time"
)

// TestOneTxUnscannedQueryRow: a handler that leaves a QueryRow of its Tx
// unscanned (an early return, in a 2xx or a 5xx answer) gets an answer: the
// completion does not wait forever for the Scan that holds the transaction.
func TestOneTxUnscannedQueryRow(t *testing.T) {
	defer func(d time.Duration) { useWait = d }(useWait)
	useWait = 100 * time.Millisecond
	for _, status := range []int{201, 500} {
		e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				tx, _ := TxFromContext(r.Context())
				_ = tx.QueryRow(r.Context(), `SELECT 1`) // never scanned
				w.WriteHeader(status)
			}
		}, nil)
		e.client.Timeout = 20 * time.Second
		code, _, _, err := e.post("unscanned")
		if err != nil {
			t.Fatalf("handler answering %d with an unscanned row: %v", status, err)
		}
		if want := map[int]int{201: 503, 500: 500}[status]; code != want {
			t.Fatalf("handler answering %d with an unscanned row: answered %d, want %d", status, code, want)
		}
	}
}
