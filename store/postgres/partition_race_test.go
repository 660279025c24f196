package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
)

// waitFor polls the database until cond's query returns true (the tests below
// wait for another session to block on a lock, or for the server's clock).
func waitFor(t *testing.T, pool *pgxpool.Pool, what, cond string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var ok bool
		if err := pool.QueryRow(t.Context(), cond, args...).Scan(&ok); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitDone closes its channel once cond's query returns true; it gives up
// quietly when stop has a value (then the caller reads it).
func waitDone[T any](t *testing.T, pool *pgxpool.Pool, cond string, stop <-chan T) <-chan struct{} {
	ready := make(chan struct{})
	go func() {
		for len(stop) == 0 {
			var ok bool
			if err := pool.QueryRow(t.Context(), cond).Scan(&ok); err != nil || ok {
				close(ready)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return ready
}

// begin opens a transaction on a connection of its own, rolled back at the end.
func begin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// TestPartitionLateInsertSurvivesSweep: a claim that read the clock in an epoch
// and inserts into its partition only after the next epoch began, and after the
// sweep found that partition wholly expired (empty), must not lose its record
// when the sweep then detaches and drops the partition. The epoch is shortened
// to 2 s behind New's back, so the boundary comes within the test; two sessions
// hold the claim between its clock reading and its insert, and the sweep
// between its check and its DETACH.
func TestPartitionLateInsertSurvivesSweep(t *testing.T) {
	pool := newPool(t, "", func(c *pgxpool.Config) { c.MaxConns = 8 }) // two held, the claim, the sweep, the polls
	ctx := t.Context()
	schema := "idemkey_test_" + store.NewToken().String()[:12]
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	s, err := New(pool, WithSchema(schema), WithPartitions(MinEpoch))
	if err != nil {
		t.Fatal(err)
	}
	s.part.epoch = 2 * time.Second
	const epochSQL = `floor(extract(epoch FROM clock_timestamp()) / 2)::bigint`
	// Early in an epoch, so the claim's clock reading falls in it.
	waitFor(t, pool, "the start of an epoch", `SELECT extract(epoch FROM clock_timestamp())::numeric % 2 < 0.5`)
	var e0 int64
	if err := pool.QueryRow(ctx, `SELECT `+epochSQL).Scan(&e0); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT `+s.ident(s.table+"_ensure")+`(6)`); err != nil {
		t.Fatal(err) // partitions far ahead: the sweep creates none
	}
	env := &partEnv{t: t, pool: pool, s: s}

	holdClaim := begin(t, pool) // a far partition, which the claim's read scans
	if _, err := holdClaim.Exec(ctx, `LOCK TABLE `+env.part(e0+5)+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	id := newID()
	claimed := make(chan error, 1)
	go func() {
		res, err := s.Claim(ctx, claimReq(id, time.Hour))
		if err == nil && res.Outcome != store.Claimed {
			err = fmt.Errorf("not claimed: %v", res.Outcome)
		}
		claimed <- err
	}()
	const blockedSQL = `SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted AND relation = to_regclass($1))`
	waitFor(t, pool, "the claim to block", blockedSQL, env.part(e0+5))
	waitFor(t, pool, "the next epoch", `SELECT `+epochSQL+` > $1`, e0)

	holdDetach := begin(t, pool)
	if _, err := holdDetach.Exec(ctx, `LOCK TABLE ONLY `+s.Table()+` IN SHARE UPDATE EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	swept := make(chan error, 1)
	go func() {
		_, err := s.Sweep(ctx, 0)
		swept <- err
	}()
	waitFor(t, pool, "the sweep to block in its DETACH", blockedSQL, s.Table())
	if err := holdClaim.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-claimed; err != nil {
		t.Fatalf("claim: %v", err)
	}
	if err := holdDetach.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-swept; err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if n := env.rows(id); n != 1 {
		t.Fatalf("%d rows for the claimed key after the sweep, want 1 (the sweep dropped a live record)", n)
	}
	if res, err := s.Claim(ctx, claimReq(id, time.Hour)); err != nil || res.Outcome != store.InFlight {
		t.Fatalf("duplicate claim: %+v %v, want in flight", res, err)
	}
}

// TestPartitionClaimRepeatableRead: the claim function serialises a key by an
// advisory lock, not a unique index, so it needs each statement's fresh
// snapshot; under REPEATABLE READ (a server or role default) a claim that waited
// for the holder's commit would not see its row and claim the key a second
// time. It must fail instead, never claim twice.
func TestPartitionClaimRepeatableRead(t *testing.T) {
	admin := newPool(t, "")
	rr := newPool(t, "", func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	})
	s := newStore(t, admin, rr, WithPartitions(testEpoch))
	env := &partEnv{t: t, pool: admin, s: s}
	ctx := t.Context()
	id := newID()
	holder := begin(t, admin)
	req := claimReq(id, time.Hour)
	if _, err := holder.Exec(ctx, s.claimSQL, claimArgs(req, store.NewToken())...); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res store.ClaimResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := s.Claim(ctx, req)
		done <- answer{res, err}
	}()
	var a answer
	select { // the duplicate waits for the key's lock, or fails at once
	case a = <-done:
		if err := holder.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	case <-waitDone(t, admin, `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`, done):
		if err := holder.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		a = <-done
	}
	if a.err == nil && a.res.Outcome == store.Claimed {
		t.Fatalf("duplicate under REPEATABLE READ claimed the key too (%d rows)", env.rows(id))
	}
	if a.err == nil && a.res.Outcome != store.InFlight {
		t.Fatalf("duplicate: %+v, want an error or in flight", a.res)
	}
	if n := env.rows(id); n != 1 {
		t.Fatalf("%d rows for the key, want 1", n)
	}
}

// TestPartitionSweepRefusesOtherEpoch: a store configured with another epoch
// than the table's (built without Migrate, which would refuse it) must not
// sweep: it would number the epochs in other units and take the current and
// next partitions for past ones.
func TestPartitionSweepRefusesOtherEpoch(t *testing.T) {
	e := newPartEnv(t)
	other, err := New(e.pool, WithSchema(e.s.schema), WithPartitions(MinEpoch))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Sweep(t.Context(), 0); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("sweep with another epoch: %v, want ErrInvalid", err)
	}
	for n := e.cur; n <= e.cur+2; n++ {
		if !e.hasPartition(n) {
			t.Errorf("partition of epoch %+d dropped by a store of another epoch", n-e.cur)
		}
	}
}
