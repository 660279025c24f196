package idemgrpc_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	idemgrpc "github.com/idemkey/idemkey/middleware/grpc"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/postgres"
)

// WithOneTx fails at construction on a store that holds no claim in a
// transaction, and for a method WithMethods leaves unprotected.
func TestOneTxRefusedAtConstruction(t *testing.T) {
	if _, err := idemgrpc.New(memory.New(), idemgrpc.GlobalScope, idemgrpc.WithOneTx(chargeMethod)); err == nil {
		t.Fatal("WithOneTx over the memory store: no error")
	}
	if _, err := idemgrpc.New(memory.New(), idemgrpc.GlobalScope, idemgrpc.WithOneTx()); err != nil {
		t.Fatalf("WithOneTx naming no method: %v", err)
	}
	st, pool := postgresStorePool(t)
	if _, err := idemgrpc.New(st, idemgrpc.GlobalScope, idemgrpc.WithOneTx(chargeMethod)); err == nil {
		t.Fatal("WithOneTx over the plain Postgres store: no error")
	}
	ts, err := st.OneTx(pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idemgrpc.New(ts, idemgrpc.GlobalScope, idemgrpc.WithMethods(readMethod), idemgrpc.WithOneTx(chargeMethod)); err == nil {
		t.Fatal("WithOneTx naming a method WithMethods leaves unprotected: no error")
	}
}

// A method named by WithOneTx runs its handler in the claim's transaction: its
// row and the stored answer commit once (a retry replays, no second row); an
// answer the release rule releases rolls its row back; a transaction ended
// outside the library answers UNAVAILABLE. Other methods keep
// the default mode (no transaction in the handler's context).
func TestOneTxMethodPostgres(t *testing.T) {
	st, pool := postgresStorePool(t)
	ts, err := st.OneTx(pool)
	if err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{"idemkey_grpc_rows_" + store.NewToken().String()[:12]}.Sanitize()
	if _, err := pool.Exec(t.Context(), "CREATE TABLE "+table+" (v text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table) })
	svc := &service{fn: func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		tx, ok := postgres.TxFromContext(ctx)
		if !ok {
			return wrapperspb.String("no transaction"), nil
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (v) VALUES ($1)", in.GetValue()); err != nil {
			return nil, err
		}
		switch in.GetValue() {
		case "busy":
			return nil, status.Error(codes.Unavailable, "try again")
		case "side door": // ends the transaction where the library cannot see it
			if _, err := tx.Conn().Exec(ctx, "COMMIT"); err != nil {
				return nil, err
			}
		}
		return wrapperspb.String("charged " + in.GetValue()), nil
	}}
	conn := serve(t, newInterceptor(t, ts, idemgrpc.WithOneTx(chargeMethod)), svc)
	rows := func(v string) (n int) {
		t.Helper()
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table+" WHERE v = $1", v).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i := range 2 {
		got, hdr, err := call(t.Context(), conn, chargeMethod, "k1", "a")
		if err != nil || got != "charged a" || (i == 1) != (len(hdr.Get(idemgrpc.ReplayedMetadata)) > 0) {
			t.Fatalf("call %d: %q, replayed %v, %v", i, got, hdr.Get(idemgrpc.ReplayedMetadata), err)
		}
	}
	if n := rows("a"); n != 1 || svc.calls.Load() != 1 {
		t.Fatalf("%d rows after %d handler runs; want the one run's row", n, svc.calls.Load())
	}
	for i := range 2 { // released: rolled back, runs again
		if _, _, err := call(t.Context(), conn, chargeMethod, "k2", "busy"); status.Code(err) != codes.Unavailable {
			t.Fatalf("released call %d: %v", i, err)
		}
	}
	if n := rows("busy"); n != 0 || svc.calls.Load() != 3 {
		t.Fatalf("%d rows of released calls after %d handler runs; want none after 3", n, svc.calls.Load())
	}
	// The transaction ended through the side door: what committed is unknown,
	// so the client gets UNAVAILABLE, never the handler's success.
	if got, _, err := call(t.Context(), conn, chargeMethod, "k4", "side door"); status.Code(err) != codes.Unavailable {
		t.Fatalf("side door: %q, %v; want UNAVAILABLE", got, err)
	}
	if got, _, err := call(t.Context(), conn, readMethod, "k3", "r"); err != nil || got != "no transaction" {
		t.Fatalf("default-mode method: %q, %v", got, err)
	}
}
