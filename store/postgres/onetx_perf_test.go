package postgres

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
)

// TestOneTxReplayWhileLockHeld: a claim of a completed key answers the replay
// (or the mismatch) from its first read, at once, while another transaction
// holds the key's lock: replays of a hot key do not queue on the lock, nor get
// 409 past the lock wait.
func TestOneTxReplayWhileLockHeld(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	ts, err := s.OneTx(pool, WithLockWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	req := store.ClaimRequest{ID: newID(), Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
	res, tx, err := ts.ClaimTx(ctx, req)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatal(res, err)
	}
	if _, err := tx.Commit(ctx, store.Response{Status: 201, Body: []byte("done")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.WithoutCancel(ctx))
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, ts.keyLock(req.ID)); err != nil {
		t.Fatal(err)
	}
	for _, fp := range []string{"a", "b"} {
		r := req
		r.Fingerprint = fingerprint(fp)
		t0 := time.Now()
		res, tx, err := ts.ClaimTx(ctx, r)
		if err != nil || tx != nil {
			t.Fatal(err, tx)
		}
		want := store.Completed
		if fp == "b" {
			want = store.Mismatch
		}
		if res.Outcome != want || time.Since(t0) > time.Second {
			t.Fatalf("fingerprint %s: outcome %v after %v, want %v at once", fp, res.Outcome, time.Since(t0), want)
		}
		if want == store.Completed && (res.Record == nil || res.Record.Status != http.StatusCreated) {
			t.Fatalf("record %+v", res.Record)
		}
	}
}

// TestOneTxLeftoverStatementNotShared: a statement of the handler's still
// running in a goroutine the handler left when the library takes the
// transaction back is never sharing the connection with the commit: past
// useWait the connection is closed under it and dropped from the pool, the
// client gets 503, nothing commits (-race finds the sharing).
func TestOneTxLeftoverStatementNotShared(t *testing.T) {
	defer func(d time.Duration) { useWait = d }(useWait)
	useWait = 100 * time.Millisecond
	leftover := make(chan error, 1)
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			tx, _ := TxFromContext(r.Context())
			started := make(chan struct{})
			go func() {
				close(started)
				_, err := tx.Exec(context.WithoutCancel(r.Context()), `INSERT INTO `+e.side+` (key) SELECT 'leftover' FROM pg_sleep(2)`)
				leftover <- err
			}()
			<-started
			time.Sleep(20 * time.Millisecond) // let the statement start; either way the commit must not share the connection
			w.WriteHeader(201)
		}
	}, nil)
	code, _, _, err := e.post("leftover")
	if err != nil || code != 503 {
		t.Fatalf("answered %d, %v; want 503", code, err)
	}
	if err := <-leftover; err == nil {
		t.Fatal("the leftover statement succeeded after the library took the transaction back")
	}
	if rows, _, records := e.counts(); rows != 0 || records != 0 {
		t.Fatalf("%d rows, %d records committed; want none", rows, records)
	}
}

// TestOneTxAbortedRecordOnOneConnection: the record of an aborted transaction
// is committed on the claim's own connection: with a pool of one connection the
// stored status is answered and replayed (a second connection would wait for
// the claim timeout and answer 503).
func TestOneTxAbortedRecordOnOneConnection(t *testing.T) {
	pool := newPool(t, "", func(c *pgxpool.Config) { c.MaxConns = 1 })
	e := newOneTxEnv(t, pool, func(e *oneTxEnv) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			tx, _ := TxFromContext(r.Context())
			if _, err := tx.Exec(r.Context(), `SELECT 1/0`); err == nil {
				t.Error("1/0 succeeded")
			}
			w.WriteHeader(422)
		}
	}, nil)
	for i := range 2 {
		code, h, _, err := e.post("aborted-one-conn")
		if err != nil || code != 422 || (i == 1) != (h.Get("Idempotent-Replayed") != "") {
			t.Fatalf("request %d: %d %v replayed %q", i, code, err, h.Get("Idempotent-Replayed"))
		}
	}
}
