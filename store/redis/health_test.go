package redis

import (
	"errors"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis/redistest"
)

// TestPing: Ping answers on a live server and fails, wrapped, once the server is
// stopped (a private one) or without a client.
func TestPing(t *testing.T) {
	ctx := t.Context()
	if err := NewForTest(t, redistest.Shared(t)).Ping(ctx); err != nil {
		t.Errorf("shared server: Ping = %v", err)
	}
	srv := redistest.StartServer(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer c.Close()
	s := NewForTest(t, c)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("private server: Ping = %v", err)
	}
	srv.Stop()
	if err := s.Ping(ctx); err == nil || errors.Is(err, store.ErrDegraded) {
		t.Errorf("stopped server: Ping = %v, want the client's error", err)
	}
	if err := (&Store{}).Ping(ctx); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("nil client: Ping = %v, want ErrInvalid", err)
	}
}
