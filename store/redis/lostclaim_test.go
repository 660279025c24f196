package redis_test

import (
	"syscall"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestHungRedisLostClaimReleased: a request answered 503 while a private Redis is
// SIGSTOPped leaves a claim script that runs when it resumes; the middleware
// releases it in the background, fenced by its token, so the retry runs within a
// second of SIGCONT (storetest.LostClaimReleased).
func TestHungRedisLostClaimReleased(t *testing.T) {
	srv := redistest.StartServer(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 4})
	t.Cleanup(func() { _ = c.Close() })
	signal := func(sig syscall.Signal) func() {
		return func() {
			if err := syscall.Kill(srv.Pid(), sig); err != nil {
				t.Error(err)
			}
		}
	}
	storetest.LostClaimReleased(t, redis.NewForTest(t, c), signal(syscall.SIGSTOP), signal(syscall.SIGCONT))
}
