package postgres

import (
	"context"
	"net/http"
	"testing"
	"time"

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
