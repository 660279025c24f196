package storeenv

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/tiered"
)

// open opens the server-backed stores. IDEM_TABLE (default idemkey_records) and
// IDEM_REDIS_PREFIX (default the Redis store's own) let several applications, or
// tests, share one database and one Redis.
func open(ctx context.Context, name string, getenv func(string) string) (*Store, error) {
	switch name {
	case "postgres":
		pool, pg, err := openPostgres(ctx, getenv, name)
		if err != nil {
			return nil, err
		}
		stopSweeper := pg.StartSweeper(context.Background(), sweepInterval)
		return &Store{Store: pg, Name: name, Ping: pool.Ping, Close: func() { stopSweeper(); pool.Close() }}, nil
	case "redis":
		client, rs, err := openRedis(ctx, getenv, name)
		if err != nil {
			return nil, err
		}
		if err := client.Ping(ctx).Err(); err != nil {
			client.Close()
			return nil, fmt.Errorf("redis store: %w", err)
		}
		return &Store{Store: rs, Name: name, Ping: pingRedis(client), Close: func() { client.Close() }}, nil
	case "tiered":
		pool, pg, err := openPostgres(ctx, getenv, name)
		if err != nil {
			return nil, err
		}
		client, rs, err := openRedis(ctx, getenv, name)
		if err != nil {
			pool.Close()
			return nil, err
		}
		stopSweeper := pg.StartSweeper(context.Background(), sweepInterval)
		// Postgres decides; Redis is a cache, so readiness needs Postgres only.
		return &Store{Store: tiered.New(rs, pg), Name: name, Ping: pool.Ping, Close: func() {
			stopSweeper()
			client.Close()
			pool.Close()
		}}, nil
	}
	return nil, fmt.Errorf("%w: IDEM_STORE=%q is not one of memory, postgres, redis, tiered", ErrConfig, name)
}

const sweepInterval = time.Minute

func openPostgres(ctx context.Context, getenv func(string) string, forStore string) (*pgxpool.Pool, *postgres.Store, error) {
	url, err := need(getenv, "DATABASE_URL", forStore)
	if err != nil {
		return nil, nil, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: DATABASE_URL: %w", ErrConfig, err)
	}
	var opts []postgres.Option
	if t := getenv("IDEM_TABLE"); t != "" {
		opts = append(opts, postgres.WithTable(t))
	}
	pg, err := postgres.New(pool, opts...)
	if err == nil {
		err = pg.Migrate(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("postgres store: %w", err)
	}
	return pool, pg, nil
}

func openRedis(ctx context.Context, getenv func(string) string, forStore string) (goredis.UniversalClient, *redis.Store, error) {
	url, err := need(getenv, "REDIS_URL", forStore)
	if err != nil {
		return nil, nil, err
	}
	o, err := goredis.ParseURL(url)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: REDIS_URL: %w", ErrConfig, err)
	}
	// Honour each call's context deadline (the tiered store's short timeout)
	// instead of waiting out go-redis's read timeout on a hung server.
	o.ContextTimeoutEnabled = true
	client := goredis.NewClient(o)
	var opts []redis.Option
	if p := getenv("IDEM_REDIS_PREFIX"); p != "" {
		opts = append(opts, redis.WithPrefix(p))
	}
	// No ping here: the tiered store starts, and runs, with Redis down.
	return client, redis.New(client, opts...), nil
}

func pingRedis(c goredis.UniversalClient) func(context.Context) error {
	return func(ctx context.Context) error { return c.Ping(ctx).Err() }
}
