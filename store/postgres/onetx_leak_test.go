package postgres

import (
	"errors"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/middleware"
)

// TestOneTxNoLeaks: on a pool of 2 connections, every way a one-transaction
// request ends (committed, released by a 500, a panic, an aborted transaction
// answered 201, savepoints committed and rolled back, a goroutine that keeps
// the transaction past the return, a side-door COMMIT, a statement refused by
// the gate) gives its connection back and leaves no goroutine behind; the
// goroutine's late statement is refused (pgx.ErrTxClosed) and the gate's
// refusal is ErrTxOwned.
func TestOneTxNoLeaks(t *testing.T) {
	pool := newPool(t, "", func(c *pgxpool.Config) { c.MaxConns = 2 })
	late := make(chan error, 1)
	gate := make(chan error, 1)
	e := newOneTxEnv(t, pool, func(e *oneTxEnv) http.HandlerFunc {
		inner := insertInTx(e)
		return func(w http.ResponseWriter, r *http.Request) {
			tx, _ := TxFromContext(r.Context())
			id, _ := middleware.KeyFromContext(r.Context())
			switch mode, _, _ := strings.Cut(id.Key, "-"); mode {
			case "release":
				inner(httpDiscard{}, r)
				w.WriteHeader(500)
				return
			case "panic":
				inner(httpDiscard{}, r)
				panic(http.ErrAbortHandler)
			case "abort":
				_, _ = tx.Exec(r.Context(), `SELECT 1/0`)
				w.WriteHeader(201)
				return
			case "savepoints":
				for _, commit := range []bool{true, false} {
					sp, err := tx.Begin(r.Context())
					if err != nil {
						http.Error(w, err.Error(), 500)
						return
					}
					_, _ = sp.Exec(r.Context(), `INSERT INTO `+e.side+` (key) VALUES ('sp')`)
					if commit {
						err = sp.Commit(r.Context())
					} else {
						err = sp.Rollback(r.Context())
					}
					if err != nil {
						http.Error(w, err.Error(), 500)
						return
					}
				}
			case "spawn":
				returned := make(chan struct{})
				defer close(returned)
				go func() {
					<-returned
					for {
						_, err := tx.Exec(t.Context(), `INSERT INTO `+e.side+` (key) VALUES ('late')`)
						if err != nil {
							late <- err
							return
						}
					}
				}()
			case "sidedoor":
				_, _ = tx.Conn().Exec(r.Context(), `COMMIT`)
				w.WriteHeader(201)
				return
			case "gate":
				_, err := tx.Exec(r.Context(), `SELECT 1 AS a$b$; COMMIT`)
				gate <- err
			}
			inner(w, r)
		}
	}, nil)
	want := map[string]int{"ok": 201, "release": 500, "abort": 201, "savepoints": 201, "spawn": 201, "sidedoor": 503, "gate": 201}
	before := runtime.NumGoroutine()
	for round := range 3 {
		for _, mode := range []string{"ok", "release", "panic", "abort", "savepoints", "spawn", "sidedoor", "gate"} {
			code, _, body, err := e.post(mode + "-" + string(rune('a'+round)))
			if mode == "panic" {
				if err == nil {
					t.Errorf("panic: answered %d %q, want the connection cut", code, body)
				}
			} else if err != nil || code != want[mode] {
				t.Errorf("%s: %d %q %v; want %d", mode, code, body, err, want[mode])
			}
			waitUntil(t, mode+": connection back in the pool", func() bool { return pool.Stat().AcquiredConns() == 0 })
		}
		if err := <-late; !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("statement after the handler returned = %v, want pgx.ErrTxClosed", err)
		}
		if err := <-gate; !errors.Is(err, ErrTxOwned) {
			t.Errorf("gate = %v, want ErrTxOwned", err)
		}
	}
	e.client.CloseIdleConnections()
	waitUntil(t, "goroutines back to the count before", func() bool { return runtime.NumGoroutine() <= before })
	if rows, _, _ := e.counts(); rows == 0 {
		t.Fatal("no rows")
	}
}

type httpDiscard struct{}

func (httpDiscard) Header() http.Header         { return http.Header{} }
func (httpDiscard) Write(b []byte) (int, error) { return len(b), nil }
func (httpDiscard) WriteHeader(int)             {}

// waitUntil polls cond for up to 10 s (the pool and the server end their work
// after the client has its answer).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
