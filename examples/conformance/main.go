// Command conformance serves the fixture app of docs/conformance.md
// behind the idempotency middleware, so a peer's conformance vectors (the IETF
// draft-ietf-httpapi-idempotency-key-header) can drive it over HTTP.
//
//	go run ./examples/conformance
//
// Environment (docs/architecture.md section 6; see package setup):
//
//	ADDR                listen address, default 127.0.0.1:8080
//	IDEM_STORE          memory (default), postgres, redis, tiered, mysql or dynamodb
//	DATABASE_URL        Postgres, for postgres and tiered
//	REDIS_URL           Redis, for redis and tiered
//	MYSQL_DSN           MySQL or MariaDB (go-sql-driver DSN), for mysql
//	AWS_REGION, DYNAMODB_ENDPOINT  DynamoDB's region or a local endpoint, for dynamodb
//	IDEM_LEASE          lease of a claim, Go duration, default 10s
//	IDEM_RETENTION      how long responses are replayed, default 24h
//	IDEM_MEMORY_MAX_BYTES  the memory store's bound in bytes, default 64 MiB; 0: none
//	IDEM_REPLAY_HEADER  header marking a replay, default Idempotent-Replayed
//
// The scope of a key is the X-Client-ID header ("anonymous" when absent). POST
// /reset forgets every stored key: on a persistent store it deletes the store's
// records, so every fixture sharing the store (a restarted one, a second
// instance) forgets them and they keep sharing the keys sent after it; on the
// memory store it moves to a new scope generation. Before any reset a restart
// after a crash still sees its predecessor's keys. Once the
// listener accepts connections the server prints "listening on http://ADDR"; it
// shuts down gracefully on SIGINT or SIGTERM.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/examples/internal/serve"
	"github.com/idemkey/idemkey/examples/internal/setup"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/tiered"
)

func main() { serve.Main("conformance", run) }

// run parses the environment, opens its connections (package setup), builds the
// store and the fixture behind the middleware, and serves until ctx is done, then
// drains in-flight requests.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer, logger *slog.Logger) error {
	env, err := setup.Load(getenv)
	if err != nil {
		return err
	}
	conns, err := setup.Connect(ctx, env)
	if err != nil {
		return err
	}
	defer conns.Close()
	st, forget, err := newStore(ctx, env, conns, logger)
	if err != nil {
		return err
	}
	handler, err := newHandler(env, st, forget, logger)
	if err != nil {
		return err
	}
	return serve.ListenAndServe(ctx, env.Addr, handler, stdout, logger, "store", env.Store)
}

// newHandler mounts the fixture: /reset and /healthz outside the middleware,
// everything else behind it. POST and PATCH require a key, GET passes through.
// forget deletes every record of a persistent store on POST /reset; nil (the
// memory store) moves to a new scope generation instead.
func newHandler(env setup.Env, st store.Store, forget forgetFunc, logger *slog.Logger) (http.Handler, error) {
	f := makeFixture(forget)
	opts := []middleware.Option{
		middleware.WithLease(env.Lease),
		middleware.WithRecordRetention(policy.RetentionRule{Default: env.Retention}),
		middleware.WithLogger(logger),
	}
	if env.ReplayHeader != "" {
		opts = append(opts, middleware.WithReplay(middleware.ReplayRule{ReplayedHeader: env.ReplayHeader}))
	}
	idem, err := middleware.New(st, f.scope, opts...)
	if err != nil {
		return nil, err
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /reset", f.reset)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.Handle("/", idem.Handler(f.routes()))
	return mux, nil
}

// newStore builds the idempotency store IDEM_STORE names on the shared
// connections, and how POST /reset forgets its records (nil for the memory
// store). Postgres decides every claim of the postgres and tiered stores;
// tiered puts Redis in front as a cache; mysql keeps the records in MySQL or
// MariaDB.
func newStore(ctx context.Context, env setup.Env, conns *setup.Conns, logger *slog.Logger) (store.Store, forgetFunc, error) {
	switch env.Store {
	case "memory":
		return memory.New(memory.WithMaxBytes(env.MemoryMaxBytes)), nil, nil
	case "redis":
		rs, err := redis.New(conns.Redis, redis.WithPrefix(env.RedisPrefix))
		return rs, forgetRedis(conns.Redis, env.RedisPrefix), err
	case "mysql":
		st, err := setup.MySQLStore(ctx, env, conns, logger)
		if err != nil {
			return nil, nil, err
		}
		return st, forgetSQL(conns.MySQL, env.IdemTable), nil
	case "dynamodb": // /reset moves to a new scope generation, as on memory
		st, err := setup.DynamoDBStore(ctx, env, logger)
		if err != nil {
			return nil, nil, err
		}
		return st, nil, nil
	}
	pg, err := postgres.New(conns.Pool, postgres.WithTable(env.IdemTable), postgres.WithLogger(logger))
	if err == nil {
		err = pg.Migrate(ctx)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("postgres store: %w", err)
	}
	conns.OnClose(pg.StartSweeper(context.Background(), time.Minute))
	forget := forgetPostgres(conns.Pool, env.IdemTable)
	if env.Store == "postgres" {
		return pg, forget, nil
	}
	fast, err := redis.New(conns.Redis, redis.WithPrefix(env.RedisPrefix))
	if err != nil {
		return nil, nil, err
	}
	ts, err := tiered.New(fast, pg, tiered.WithLogger(logger))
	if err != nil {
		return nil, nil, fmt.Errorf("tiered store: %w", err)
	}
	// The cache first: a record it still held after Postgres forgot it would be replayed.
	return ts, both(forgetRedis(conns.Redis, env.RedisPrefix), forget), nil
}
