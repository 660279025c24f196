package postgres

import (
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store/storetest"
)

// TestHungPostgresLostClaimReleased: a request answered 503 while the private
// cluster is SIGSTOPped leaves a claim statement that lands when it resumes; the
// middleware releases it in the background, fenced by its token, so the retry
// runs within a second of SIGCONT (storetest.LostClaimReleased).
func TestHungPostgresLostClaimReleased(t *testing.T) {
	c := startCluster(t)
	pool := newPool(t, c.url(), func(cfg *pgxpool.Config) { cfg.MaxConns = 4 })
	s, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	storetest.LostClaimReleased(t, s, func() { c.Signal(t, syscall.SIGSTOP) }, func() { c.Signal(t, syscall.SIGCONT) })
}

// TestHungPostgresWhileHandlerRuns: the private cluster is SIGSTOPped while a
// request is in its handler; the client's answer still arrives within one store
// bound, and the completion, retried in the background, stores the record after
// SIGCONT, which the retry replays (storetest.HungWhileHandlerRuns).
func TestHungPostgresWhileHandlerRuns(t *testing.T) {
	c := startCluster(t)
	pool := newPool(t, c.url(), func(cfg *pgxpool.Config) { cfg.MaxConns = 4 })
	s, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	storetest.HungWhileHandlerRuns(t, s, func() { c.Signal(t, syscall.SIGSTOP) }, func() { c.Signal(t, syscall.SIGCONT) })
}
