package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql/mysqltest"
)

func fingerprint(s string) store.Fingerprint {
	var f store.Fingerprint
	copy(f[:], s)
	return f
}

// sideTable creates a table for a handler's own rows, dropped at cleanup.
func sideTable(t *testing.T, db *sql.DB) string {
	t.Helper()
	name := "charges_" + store.NewToken().String()[:12]
	if _, err := db.ExecContext(t.Context(), "CREATE TABLE `"+name+"` (id VARCHAR(64) PRIMARY KEY) ENGINE = InnoDB"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE `"+name+"`") })
	return name
}

func rows(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM `"+table+"`").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCompleteTxCommitsWithSideEffect: the record completed in the handler's
// transaction is replayed once the transaction commits, and is still in flight
// before (another connection does not see it) and after a rollback.
func TestCompleteTxCommitsWithSideEffect(t *testing.T) {
	db := mysqltest.DB(t)
	s := mysqltest.Store(t, db)
	charges := sideTable(t, db)
	ctx := t.Context()
	for _, commit := range []bool{false, true} {
		req := store.ClaimRequest{ID: store.ID{Scope: "tenant", Key: store.NewToken().String()}, Fingerprint: fingerprint("a"),
			Lease: 10 * time.Second, Retention: time.Hour}
		res, err := s.Claim(ctx, req)
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("claim: %+v %v", res, err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO `"+charges+"` VALUES (?)", req.Key); err != nil {
			t.Fatal(err)
		}
		resp := store.Response{Status: 201, Body: []byte("charged")}
		if err := s.CompleteTx(ctx, tx, req.ID, res.Token, resp, time.Hour); err != nil {
			t.Fatalf("CompleteTx: %v", err)
		}
		if r, err := s.Claim(ctx, req); err != nil || r.Outcome != store.InFlight {
			t.Fatalf("before the commit another connection sees %+v %v, want in flight", r, err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.Claim(ctx, req)
		switch {
		case err != nil:
			t.Fatal(err)
		case commit && (r.Outcome != store.Completed || string(r.Record.Body) != "charged"):
			t.Fatalf("after the commit: %+v, want the replay", r)
		case !commit && r.Outcome != store.InFlight:
			t.Fatalf("after the rollback: %+v, want still in flight", r)
		}
	}
	if n := rows(t, db, charges); n != 1 {
		t.Fatalf("%d charges, want 1 (the committed one)", n)
	}
}

// TestCompleteTxFencedAfterTakeover: a holder whose lease expired and was taken
// over gets ErrLeaseLost inside its transaction, so its side effect rolls back;
// bad arguments are refused before anything is sent.
func TestCompleteTxFencedAfterTakeover(t *testing.T) {
	db := mysqltest.DB(t)
	s := mysqltest.Store(t, db)
	charges := sideTable(t, db)
	ctx := t.Context()
	req := store.ClaimRequest{ID: store.ID{Scope: "tenant", Key: "k"}, Fingerprint: fingerprint("a"), Lease: 20 * time.Millisecond, Retention: time.Hour}
	stale, err := s.Claim(ctx, req)
	if err != nil || stale.Outcome != store.Claimed {
		t.Fatalf("claim: %+v %v", stale, err)
	}
	time.Sleep(40 * time.Millisecond) // the lease runs out on the server's clock
	over, err := s.Claim(ctx, req)
	if err != nil || over.Outcome != store.Claimed || !over.Takeover {
		t.Fatalf("takeover: %+v %v", over, err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "INSERT INTO `"+charges+"` VALUES ('stale')"); err != nil {
		t.Fatal(err)
	}
	err = s.CompleteTx(ctx, tx, req.ID, stale.Token, store.Response{Status: 201}, time.Hour)
	if !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("stale CompleteTx = %v, want ErrLeaseLost", err)
	}
	_ = tx.Rollback()
	if n := rows(t, db, charges); n != 0 {
		t.Fatalf("%d charges after the stale holder rolled back", n)
	}
	if err := s.CompleteTx(ctx, nil, req.ID, over.Token, store.Response{Status: 201}, time.Hour); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("nil tx: %v, want ErrInvalid", err)
	}
	if err := s.Complete(ctx, req.ID, over.Token, store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatalf("the new holder completes: %v", err)
	}
}
