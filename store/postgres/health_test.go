package postgres

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
)

// TestPing: Ping answers through a pool's own Ping, through a querier without one
// (a transaction: SELECT 1), and fails, wrapped, on a closed pool.
func TestPing(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, "")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	closed, err := pgxpool.New(ctx, databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	for _, tc := range []struct {
		name    string
		db      Querier
		wantErr bool
	}{{"pool", pool, false}, {"transaction", tx, false}, {"closed pool", closed, true}} {
		s, err := New(tc.db)
		if err != nil {
			t.Fatal(err)
		}
		var p store.Pinger = s
		err = p.Ping(ctx)
		if (err != nil) != tc.wantErr || errors.Is(err, store.ErrDegraded) {
			t.Errorf("%s: Ping = %v, want error %v (never degraded)", tc.name, err, tc.wantErr)
		}
	}
}
