// Command nethttp serves the account API of docs/architecture.md section 6 with net/http: the
// account service (package accounts) behind the idempotency middleware.
//
//	go run ./examples/nethttp
//
// On embedded defaults it needs nothing else: the memory idempotency store, an
// in-process Celeriant simulator and the memory projection. Environment: ADDR,
// IDEM_STORE, DATABASE_URL, REDIS_URL, MYSQL_DSN, CELERIANT_ADDR, PROJECTION, IDEM_LEASE,
// IDEM_RETENTION (see package setup). Routes:
//
//	GET  /api/accounts, /api/accounts/{id}/balance, /api/accounts/{id}/history
//	POST /api/accounts/{id}/deposit, /api/accounts/{id}/withdraw, /api/transfers
//	     (Idempotency-Key required; scope = X-Client-ID, else "anonymous")
//	GET  /api/watch/stream (Server-Sent Events: live updates from Celeriant)
//	GET  /healthz, /readyz, /metrics (Prometheus text format)
//	GET  /   a web page making the calls of Celeriant's reference page (package webui)
//
// It prints "listening on http://ADDR" once it accepts connections, and on SIGINT
// or SIGTERM lets in-flight requests finish before exiting.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/examples/accounts/httpapi"
	"github.com/idemkey/idemkey/examples/accounts/webui"
	"github.com/idemkey/idemkey/examples/internal/accountsapp"
	"github.com/idemkey/idemkey/examples/internal/setup"
	"github.com/idemkey/idemkey/middleware"
	idemprom "github.com/idemkey/idemkey/observer/prometheus"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/tiered"
)

// main parses the environment, opens its connections (one Postgres pool, one
// Redis client: package setup), calls wire and serves until SIGINT or SIGTERM.
func main() { accountsapp.Main("nethttp", wire) }

// wire builds the server: the idempotency store, its metrics, the middleware,
// the account service, and the routes.
func wire(ctx context.Context, env setup.Env, conns *setup.Conns, logger *slog.Logger) (*accountsapp.App, http.Handler, error) {
	st, storeStats, err := newStore(ctx, env, conns, logger)
	if err != nil {
		return nil, nil, err
	}

	// Metrics: every decision of the middleware, and the stores' own counters
	// (the tiered store's fall-throughs to Postgres, the Postgres claim retries).
	reg := prometheus.NewRegistry()
	observer, err := idemprom.NewObserver(reg)
	if err != nil {
		return nil, nil, err
	}
	if err := reg.Register(idemprom.NewCollector(storeStats...)); err != nil {
		return nil, nil, err
	}

	// Keys are scoped by the principal accountsapp.ClientID puts in the context.
	idem, err := middleware.New(st, middleware.ScopeFromPrincipal(accountsapp.AnonymousScope),
		middleware.WithLease(env.Lease), middleware.WithRecordRetention(policy.RetentionRule{Default: env.Retention}),
		// A retry racing the original waits for its answer (IDEM_WAIT, default 5s).
		middleware.WithWaitInFlight(env.Wait),
		// Its problems carry error and message too, as the API's own (the
		// reference's page reads them).
		middleware.WithProblems(middleware.ProblemRule{Members: httpapi.ProblemMembers}),
		middleware.WithObserver(observer), middleware.WithLogger(logger))
	if err != nil {
		return nil, nil, err
	}

	app, err := accountsapp.Open(ctx, env, conns, st, reg, logger)
	if err != nil {
		return nil, nil, err
	}

	// The probes and the page outside the middleware, /api behind the client ID
	// and the middleware; any other path gets the API's 404 problem.
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", app.Healthz)
	mux.HandleFunc("/readyz", app.Readyz)
	mux.Handle("/metrics", app.MetricsHandler())
	mux.Handle("/api/", accountsapp.ClientID(idem.Handler(app.API)))
	mux.Handle("GET /{$}", webui.Handler())
	mux.Handle("/", app.API)
	return app, mux, nil
}

// newStore builds the idempotency store IDEM_STORE names on the shared
// connections, and what of it the metrics export. Postgres decides every claim
// of the postgres and tiered stores; tiered puts Redis in front as a cache;
// mysql keeps the records in MySQL or MariaDB (MYSQL_DSN), dynamodb in DynamoDB.
func newStore(ctx context.Context, env setup.Env, conns *setup.Conns, logger *slog.Logger) (store.Store, []idemprom.CollectorOption, error) {
	switch env.Store {
	case "memory":
		return memory.New(memory.WithMaxBytes(env.MemoryMaxBytes)), nil, nil
	case "redis":
		rs, err := redis.New(conns.Redis, redis.WithPrefix(env.RedisPrefix), redis.WithLogger(logger))
		if err != nil {
			return nil, nil, err
		}
		conns.OnClose(rs.StopWaiters) // the waiters' subscription (IDEM_WAIT)
		return rs, nil, nil
	case "mysql":
		ms, err := setup.MySQLStore(ctx, env, conns, logger)
		if err != nil {
			return nil, nil, err
		}
		return ms, []idemprom.CollectorOption{idemprom.WithClaimRetries(func() int64 { return ms.Stats().ClaimRetries })}, nil
	case "dynamodb":
		ds, err := setup.DynamoDBStore(ctx, env, logger)
		if err != nil {
			return nil, nil, err
		}
		return ds, nil, nil
	}
	pg, err := postgres.New(conns.Pool, postgres.WithTable(env.IdemTable), postgres.WithLogger(logger))
	if err == nil {
		err = pg.Migrate(ctx)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("postgres store: %w", err)
	}
	conns.OnClose(pg.StartSweeper(context.Background(), time.Minute))
	conns.OnClose(pg.StopWaiters) // the waiters' connection (IDEM_WAIT)
	stats := []idemprom.CollectorOption{idemprom.WithClaimRetries(func() int64 { return pg.Stats().ClaimRetries })}
	if env.Store == "postgres" {
		return pg, stats, nil
	}
	fast, err := redis.New(conns.Redis, redis.WithPrefix(env.RedisPrefix), redis.WithLogger(logger))
	if err != nil {
		return nil, nil, err
	}
	conns.OnClose(fast.StopWaiters)
	ts, err := tiered.New(fast, pg, tiered.WithLogger(logger))
	if err != nil {
		return nil, nil, fmt.Errorf("tiered store: %w", err)
	}
	return ts, append(stats, idemprom.WithTiered(ts)), nil
}
