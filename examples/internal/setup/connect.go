package setup

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	mysqldriver "github.com/go-sql-driver/mysql"
)

// Conns are the server connections an Env names, opened once by Connect and
// shared by everything that uses them.
type Conns struct {
	// Pool is the one Postgres pool (DATABASE_URL) of the idempotency store and
	// the projection; nil when Env.NeedsPostgres is false.
	Pool *pgxpool.Pool
	// Redis is the Redis client (REDIS_URL), with ContextTimeoutEnabled so every
	// call honours its context's deadline (the tiered store's short timeout)
	// instead of waiting out the client's read timeout on a hung server; nil when
	// Env.NeedsRedis is false.
	Redis *goredis.Client
	// MySQL is the MySQL/MariaDB pool (MYSQL_DSN) of the mysql store; nil for
	// the other stores. Like the Postgres pool it connects lazily.
	MySQL *sql.DB

	closers []func()
}

// Connect opens the connections env names. The pool connects lazily; for the
// redis store, which has no backstop, Redis must answer a PING now, while the
// tiered store starts, and runs, with Redis down. Errors: ErrConfig for a URL
// that does not parse, else the driver's, wrapped. On error nothing stays open.
func Connect(ctx context.Context, env Env) (c *Conns, err error) {
	c = &Conns{}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()
	if env.NeedsPostgres() {
		if c.Pool, err = pgxpool.New(ctx, env.DatabaseURL); err != nil {
			return c, fmt.Errorf("%w: DATABASE_URL: %w", ErrConfig, err)
		}
		c.OnClose(c.Pool.Close)
	}
	if env.Store == "mysql" {
		cfg, err := mysqldriver.ParseDSN(env.MySQLDSN)
		if err != nil {
			return c, fmt.Errorf("%w: MYSQL_DSN: %w", ErrConfig, err)
		}
		connector, err := mysqldriver.NewConnector(cfg)
		if err != nil {
			return c, fmt.Errorf("%w: MYSQL_DSN: %w", ErrConfig, err)
		}
		c.MySQL = sql.OpenDB(connector)
		c.OnClose(func() { _ = c.MySQL.Close() })
	}
	if env.NeedsRedis() {
		o, err := goredis.ParseURL(env.RedisURL)
		if err != nil {
			return c, fmt.Errorf("%w: REDIS_URL: %w", ErrConfig, err)
		}
		o.ContextTimeoutEnabled = true
		c.Redis = goredis.NewClient(o)
		c.OnClose(func() { _ = c.Redis.Close() })
		if env.Store == "redis" {
			if err := c.Redis.Ping(ctx).Err(); err != nil {
				return c, fmt.Errorf("redis store: %w", err)
			}
		}
	}
	return c, nil
}

// OnClose registers f to run at Close, before the functions registered earlier
// (a sweeper stops before its pool closes).
func (c *Conns) OnClose(f func()) { c.closers = append(c.closers, f) }

// Close runs the OnClose functions, last registered first, and closes the
// connections. Call it after the HTTP server has drained. Safe to call twice.
func (c *Conns) Close() {
	for i := len(c.closers) - 1; i >= 0; i-- {
		c.closers[i]()
	}
	c.closers = nil
}
