// Command echo serves the account API of docs/architecture.md section 6 with echo v4: the same
// account service, middleware and environment as examples/nethttp, with the
// middleware attached through the echo adapter (middleware/echo) on the /api
// group.
//
//	go run ./examples/echo
//
// It prints "listening on http://ADDR" once it accepts connections, and on SIGINT
// or SIGTERM lets in-flight requests finish before exiting.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/examples/accounts/httpapi"
	"github.com/idemkey/idemkey/examples/accounts/webui"
	"github.com/idemkey/idemkey/examples/internal/accountsapp"
	"github.com/idemkey/idemkey/examples/internal/setup"
	"github.com/idemkey/idemkey/middleware"
	idemecho "github.com/idemkey/idemkey/middleware/echo"
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
func main() { accountsapp.Main("echo", wire) }

// wire builds the server: the idempotency store, its metrics, the middleware,
// the account service, and the echo routes.
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
	return app, routes(app, idem), nil
}

// routes routes with echo: the probes outside the middleware, the API routes in
// an /api group behind accountsapp.ClientID and the middleware. Echo routes the
// requests; the account handler serves them (it reads the path itself). Anything
// else under /api reaches the account handler too, so 404 and 405 answers match
// the net/http server's.
func routes(a *accountsapp.App, idem *middleware.Middleware) http.Handler {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = problemErrors(a.Logger)
	e.Any("/healthz", echo.WrapHandler(http.HandlerFunc(a.Healthz)))
	e.Any("/readyz", echo.WrapHandler(http.HandlerFunc(a.Readyz)))
	e.Any("/metrics", echo.WrapHandler(a.MetricsHandler()))
	e.GET("/", echo.WrapHandler(webui.Handler()))

	api := echo.WrapHandler(a.API)
	g := e.Group("/api", echo.WrapMiddleware(accountsapp.ClientID), idemecho.Middleware(idem))
	g.GET("/accounts", api)
	g.GET("/accounts/:id/balance", api)
	g.GET("/accounts/:id/history", api)
	g.POST("/accounts/:id/deposit", api)
	g.POST("/accounts/:id/withdraw", api)
	g.POST("/transfers", api)
	g.Any("/*", api)
	return e
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

// problemErrors renders echo's own errors (unknown route, wrong method) as the
// problem details the account API answers. A committed response was already
// rendered (inside the idempotency middleware) and is left alone.
func problemErrors(logger *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		writeEchoError(logger, err, c)
	}
}

func writeEchoError(logger *slog.Logger, err error, c echo.Context) {
	status, code, detail := http.StatusInternalServerError, "INTERNAL_ERROR", "Internal error."
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			status, code, detail = he.Code, "NOT_FOUND", "No such route."
		case http.StatusMethodNotAllowed:
			status, code, detail = he.Code, "METHOD_NOT_ALLOWED", "Method not allowed on this route."
		case http.StatusRequestEntityTooLarge:
			status, code, detail = he.Code, "PAYLOAD_TOO_LARGE", "Request body is too large."
		default:
			if he.Code >= 400 && he.Code < 500 {
				status, code, detail = he.Code, "MALFORMED_REQUEST", http.StatusText(he.Code)+"."
			}
		}
	}
	if status == http.StatusInternalServerError {
		logger.ErrorContext(c.Request().Context(), "echo: internal error", "err", err)
	}
	httpapi.WriteProblem(c.Response(), status, code, detail)
}
