// Command wiring is docs/stores.md's tiered store, kept compiling.
package main

import (
	"context"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/tiered"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	pg, err := postgres.New(pool) // the backstop: it decides every claim
	if err != nil {
		log.Fatal(err)
	}
	if err := pg.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	defer pg.StartSweeper(ctx, time.Minute)() // stop the sweeper at shutdown
	defer pg.StopWaiters()

	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	rs, err := redis.New(client) // the cache: replays and 409s without a Postgres round trip
	if err != nil {
		log.Fatal(err)
	}
	defer rs.StopWaiters()
	ts, err := tiered.New(rs, pg) // redis.New(client) or pg alone work too
	if err != nil {
		log.Fatal(err)
	}
	m, err := middleware.New(ts, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
	if err != nil {
		log.Fatal(err)
	}
	// Not log.Fatal: it would skip the deferred stops.
	if err := http.ListenAndServe("127.0.0.1:8081", m.Handler(http.NotFoundHandler())); err != nil {
		log.Print(err)
	}
}
