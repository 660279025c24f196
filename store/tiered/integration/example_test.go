package tiered_test

import (
	"context"
	"log"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/tiered"
)

// Postgres decides, Redis answers replays and duplicates in one round trip. The
// client enables context timeouts so the tiered store's short Redis timeout also
// bounds socket reads.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	backstop, err := postgres.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	if err := backstop.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()

	cache, err := redis.New(client, redis.WithPrefix("app:idem:"))
	if err != nil {
		log.Fatal(err)
	}
	s, err := tiered.New(cache, backstop,
		tiered.WithObserver(func(e tiered.Event) {
			if e.Kind == tiered.FastError {
				slog.Warn("idempotency fast path degraded", "op", e.Op, "err", e.Err)
			}
		}))
	if err != nil {
		log.Fatal(err) // a nil cache or backstop
	}
	_ = s // hand it to the middleware as its store.Store
}
