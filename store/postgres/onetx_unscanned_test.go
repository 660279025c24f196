package postgres

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// TestOneTxCallBeforeScan: a handler's call on its Tx while a QueryRow of it
// is not yet scanned (on the same goroutine) returns an error at once, as
// pgx's "conn busy" on a plain transaction, for every kind of call; it does
// not wait for the Scan that follows it (before the fix it blocked forever).
// The row still scans and the request commits.
func TestOneTxCallBeforeScan(t *testing.T) {
	calls := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"Exec": func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, `SELECT 2`); return err },
		"QueryRow": func(ctx context.Context, tx pgx.Tx) error {
			var n int
			return tx.QueryRow(ctx, `SELECT 2`).Scan(&n)
		},
		"Query": func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT 2`)
			if err == nil {
				rows.Close()
				err = rows.Err()
			}
			return err
		},
		"SendBatch": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(`SELECT 2`)
			return tx.SendBatch(ctx, b).Close()
		},
		"Begin": func(ctx context.Context, tx pgx.Tx) error {
			sp, err := tx.Begin(ctx)
			if err == nil {
				err = sp.Rollback(ctx)
			}
			return err
		},
	}
	for name, second := range calls {
		t.Run(name, func(t *testing.T) {
			errs := make(chan error, 1)
			e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					tx, _ := TxFromContext(r.Context())
					row := tx.QueryRow(r.Context(), `SELECT 1`)
					errs <- second(r.Context(), tx)
					var n int
					if err := row.Scan(&n); err != nil || n != 1 {
						http.Error(w, fmt.Sprint("scan after the refused call: ", n, err), 500)
						return
					}
					w.WriteHeader(201)
				}
			}, nil)
			answered := make(chan int, 1)
			go func() {
				code, _, _, err := e.post("before-scan")
				if err != nil {
					code = -1
				}
				answered <- code
			}()
			guard := time.NewTimer(20 * time.Second) // a guard against the old hang, not a wait
			defer guard.Stop()
			select {
			case err := <-errs:
				if err == nil {
					t.Fatalf("%s before the QueryRow's Scan succeeded; want conn busy", name)
				}
			case <-guard.C:
				t.Fatalf("%s before the QueryRow's Scan blocked", name)
			}
			if code := <-answered; code != 201 {
				t.Fatalf("answered %d, want 201", code)
			}
		})
	}
}

// TestOneTxRowScannedTwice: a second Scan of a QueryRow's row (pgx answers it
// an error) gives nothing back twice: the handler's next call and the commit
// run (it used to wait forever for a transaction the first Scan had given
// back, or take the token of another call's).
func TestOneTxRowScannedTwice(t *testing.T) {
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			tx, _ := TxFromContext(r.Context())
			row := tx.QueryRow(r.Context(), `SELECT 1`)
			var n int
			first := row.Scan(&n)
			_ = row.Scan(&n)
			if _, err := tx.Exec(r.Context(), `INSERT INTO `+e.side+` (key) VALUES ('twice')`); first != nil || err != nil {
				http.Error(w, fmt.Sprint(first, err), 500)
				return
			}
			w.WriteHeader(201)
		}
	}, nil)
	e.client.Timeout = 20 * time.Second // a guard against the old hang, not a wait
	if code, _, body, err := e.post("twice"); err != nil || code != 201 {
		t.Fatalf("answered %d %q, %v; want 201", code, body, err)
	}
	if rows, _, records := e.counts(); rows != 1 || records != 1 {
		t.Fatalf("%d rows, %d records; want 1 and 1", rows, records)
	}
}
