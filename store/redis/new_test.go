package redis_test

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// unconnected is a client that never reaches a server: for what needs no I/O.
func unconnected(t testing.TB) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestNewRefusesMisconfiguration: a nil client, and any prefix with a brace
// (which would move the key's Cluster hash tag), fail New with store.ErrInvalid;
// the same prefixes without the brace, and a nil logger (slog.Default()), do not.
func TestNewRefusesMisconfiguration(t *testing.T) {
	c := unconnected(t)
	if _, err := redis.New(nil); !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "nil client") {
		t.Errorf("nil client: %v, want ErrInvalid naming it", err)
	}
	if _, err := redis.New(c, redis.WithLogger(nil), redis.WithPrefix(""), redis.WithWaiterIdle(-1)); err != nil {
		t.Errorf("nil logger, empty prefix, negative idle: %v", err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "abc:-_/{}"
	for range 500 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		prefix := string(b)
		_, err := redis.New(c, redis.WithPrefix(prefix))
		if strings.ContainsAny(prefix, "{}") {
			if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "WithPrefix") {
				t.Fatalf("prefix %q: %v, want ErrInvalid naming WithPrefix", prefix, err)
			}
		} else if err != nil {
			t.Fatalf("prefix %q: %v", prefix, err)
		}
	}
}
