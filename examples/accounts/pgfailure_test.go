package accounts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/idemkey/idemkey/celeriant/celeriantsim"
)

// TestPGFailureClassification: connection failures of the projection's database are
// ErrUnavailable (503); other database errors stay internal (500).
func TestPGFailureClassification(t *testing.T) {
	for _, tc := range []struct {
		err         error
		unavailable bool
	}{
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, true},
		{io.ErrUnexpectedEOF, true},
		{puddle.ErrClosedPool, true},
		{pgconn.ErrConnClosed, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "53300"}, true},
		{&pgconn.PgError{Code: "42P01"}, false}, // undefined table
		{&pgconn.PgError{Code: "23505"}, false},
		{errors.New("something else"), false},
	} {
		got := pgFailure(fmt.Errorf("op: %w", tc.err))
		if errors.Is(got, ErrUnavailable) != tc.unavailable {
			t.Errorf("%v: ErrUnavailable = %v, want %v", tc.err, !tc.unavailable, tc.unavailable)
		}
		if !errors.Is(got, tc.err) {
			t.Errorf("%v: cause lost: %v", tc.err, got)
		}
	}
}

// TestPGProjectionUnreachable: a projection whose database does not answer makes a
// deposit fail with ErrUnavailable, not an internal error.
func TestPGProjectionUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+addr+"/test?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	proj, err := NewPostgresProjection(pool)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(celeriantsim.New(celeriantsim.Options{}), proj)
	if err != nil {
		t.Fatal(err)
	}
	_, err = svc.Deposit(context.Background(), AliceID, 100, NewEventID())
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("deposit with the projection down: %v, want ErrUnavailable", err)
	}
	pool.Close()
	if _, err := svc.Balance(context.Background(), AliceID, 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("balance with the pool closed: %v, want ErrUnavailable", err)
	}
}
