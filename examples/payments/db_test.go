package main

import (
	"context"
	"testing"
)

// TestMigrateLeavesALiveTableAlone: a server starting (a replica, a rolling
// restart) while payments are being recorded does not queue for an exclusive
// lock on the payments table once its columns exist: such a lock waits for
// every transaction using the table, and every query after it waits behind it.
// A table from before the state column gains it.
func TestMigrateLeavesALiveTableAlone(t *testing.T) {
	pool, prefix := testPool(t)
	p := newPayments(pool, prefix)
	ctx := context.Background()
	if err := p.migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// A table from before the webhooks (no state column) gains it.
	if _, err := pool.Exec(ctx, `ALTER TABLE `+p.table+` DROP COLUMN state`); err != nil {
		t.Fatal(err)
	}
	if err := p.migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var state string
	if err := pool.QueryRow(ctx, `SELECT column_default FROM information_schema.columns WHERE table_name = $1 AND column_name = 'state'`,
		prefix+"payments").Scan(&state); err != nil || state != "'authorized'::text" {
		t.Fatalf("state column after migrating an old table: default %q, %v", state, err)
	}
	live, err := pool.Begin(ctx) // a transaction using the table: it holds ACCESS SHARE
	if err != nil {
		t.Fatal(err)
	}
	defer live.Rollback(ctx)
	if _, err := live.Exec(ctx, `SELECT count(*) FROM `+p.table); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.migrate(ctx) }()
	waitFor(t, "the second migrate to finish or to wait for a lock", func() bool {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return true
		default:
		}
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = $1::regclass AND NOT granted)`,
			p.table).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			_ = live.Rollback(ctx) // let it through, then report
			<-done
			t.Fatal("migrate of an up-to-date table waits for a lock on it behind a live transaction")
		}
		return false
	})
}
