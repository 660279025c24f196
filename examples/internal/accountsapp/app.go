package accountsapp

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/accounts"
	"github.com/idemkey/idemkey/examples/accounts/httpapi"
	"github.com/idemkey/idemkey/examples/internal/storeenv"
	"github.com/idemkey/idemkey/middleware"
)

// ScopeHeader is the request header whose value scopes idempotency keys (a stand-in
// for an authenticated principal, docs/architecture.md section 6); AnonymousScope is the scope
// of a request without it.
const (
	ScopeHeader    = "X-Client-ID"
	AnonymousScope = "anonymous"
)

// MaxScopeBytes is the longest ScopeHeader value accepted: the idempotency key's own
// limit. A longer scope does not fit the Postgres store's index, and its claim would
// fail as a 503 store_unavailable, blaming the store for bad input.
const MaxScopeBytes = 255

// probeTimeout bounds each readiness check; seedTimeout bounds startup seeding.
const (
	probeTimeout = 2 * time.Second
	seedTimeout  = 30 * time.Second
)

// App is the wired account service. Build it with Open, mount its handlers on a
// router, and Close it after the HTTP server has drained.
type App struct {
	Config Config
	// Store is the idempotency store (IDEM_STORE).
	Store *storeenv.Store
	// Events is the Celeriant event store: the wire client, or the simulator.
	Events celeriant.EventStore
	// Service is the account service over Events and the projection.
	Service *accounts.Service
	// Idempotency is the middleware: key required on every POST (and PATCH), scope
	// from ScopeHeader, IDEM_LEASE and IDEM_RETENTION, observed by Metrics.
	Idempotency *middleware.Middleware
	// API serves the routes of docs/architecture.md section 6 under /api, unprotected: put
	// Idempotency in front of it. It answers unknown routes with 404 problems.
	API http.Handler
	// Registry holds the application's metrics (never the global registry).
	Registry *prometheus.Registry
	// Metrics is the middleware's observer, registered in Registry.
	Metrics *Metrics

	// Logger is the application's logger.
	Logger *slog.Logger

	checks  []check
	closers []func()
}

// check is one readiness probe: nil means ready.
type check struct {
	name string
	fn   func(ctx context.Context) error
}

// Open wires everything cfg and getenv describe: the idempotency store (storeenv),
// Celeriant (the wire client for cfg.CeleriantAddr, else an in-process simulator),
// the projection (memory, or Postgres migrated at startup), the account service
// (seeded at startup; a failure to seed fails Open), the middleware and metrics.
// On error everything opened so far is closed.
func Open(ctx context.Context, cfg Config, getenv func(string) string, logger *slog.Logger) (a *App, err error) {
	a = &App{Config: cfg, Logger: logger, Registry: prometheus.NewRegistry()}
	defer func() {
		if err != nil {
			a.Close()
			a = nil
		}
	}()

	a.Store, err = storeenv.Open(ctx, getenv)
	if err != nil {
		return a, err
	}
	a.closers = append(a.closers, a.Store.Close)
	storePing := a.Store.Ping
	if storePing == nil { // in process: always there
		storePing = func(context.Context) error { return nil }
	}
	a.checks = append(a.checks, check{"store", storePing})

	if cfg.CeleriantAddr == "" {
		sim := celeriantsim.New(celeriantsim.Options{})
		a.Events = sim
		a.closers = append(a.closers, func() { _ = sim.Close() })
	} else {
		client, err := celeriant.New(celeriant.Config{Addrs: []string{cfg.CeleriantAddr}, Logger: logger})
		if err != nil {
			return a, fmt.Errorf("%w: CELERIANT_ADDR=%q: %w", ErrConfig, cfg.CeleriantAddr, err)
		}
		a.Events = client
		a.closers = append(a.closers, func() { _ = client.Close() })
	}
	a.checks = append(a.checks, check{"celeriant", a.pingCeleriant})

	var proj accounts.Projection
	switch cfg.Projection {
	case "postgres":
		pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
		if err != nil {
			return a, fmt.Errorf("%w: DATABASE_URL: %w", ErrConfig, err)
		}
		a.closers = append(a.closers, pool.Close)
		pg, err := accounts.NewPostgresProjection(pool, accounts.WithTablePrefix(cfg.TablePrefix),
			accounts.WithPostgresWindow(indexWindow(cfg.Retention)))
		if err != nil {
			return a, err
		}
		if err := pg.Migrate(ctx); err != nil {
			return a, fmt.Errorf("postgres projection: %w", err)
		}
		proj = pg
		a.checks = append(a.checks, check{"projection", pool.Ping})
	default:
		proj = accounts.NewMemoryProjection()
	}

	a.Service, err = accounts.New(a.Events, proj, accounts.WithLogger(logger), accounts.WithLandedLookback(cfg.Retention))
	if err != nil {
		return a, err
	}
	seedCtx, cancel := context.WithTimeout(ctx, seedTimeout)
	err = a.Service.Seed(seedCtx)
	cancel()
	if err != nil {
		return a, fmt.Errorf("seeding the accounts (is Celeriant at %q up?): %w", cfg.CeleriantAddr, err)
	}
	if sim, ok := a.Events.(*celeriantsim.Sim); ok && cfg.SimDelay > 0 {
		sim.SetDelay(cfg.SimDelay)
	}

	if err := a.Registry.Register(collectors.NewGoCollector()); err != nil {
		return a, err
	}
	if err := a.Registry.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return a, err
	}
	if a.Metrics, err = NewMetrics(a.Registry); err != nil {
		return a, err
	}
	a.Idempotency, err = middleware.New(a.Store, middleware.ScopeFromHeader(ScopeHeader, AnonymousScope),
		middleware.WithLease(cfg.Lease), middleware.WithRetention(cfg.Retention),
		middleware.WithObserver(a.Metrics), middleware.WithLogger(logger))
	if err != nil {
		return a, err
	}
	a.API = httpapi.New(a.Service, httpapi.WithLogger(logger), httpapi.WithKeyFunc(keyFromRequest),
		httpapi.WithLandedFunc(takeoverFromRequest))
	return a, nil
}

// takeoverFromRequest tells the account service that the request's claim took over an
// expired lease: the previous holder may have written before it died, so the service
// searches the stream for the request's event before writing.
func takeoverFromRequest(r *http.Request) bool {
	c, ok := middleware.ClaimFromContext(r.Context())
	return ok && c.Takeover
}

// indexWindow is the Postgres projection's dedup window for a middleware retention: at
// least the retention, so the durable index remembers a write as long as the middleware
// remembers its key, and never below accounts.DefaultWindow.
func indexWindow(retention time.Duration) time.Duration {
	return max(retention, accounts.DefaultWindow)
}

// keyFromRequest hands the middleware's scope and key to the account service, which
// derives the Celeriant EventId from them.
func keyFromRequest(r *http.Request) (scope, key string, ok bool) {
	id, ok := middleware.KeyFromContext(r.Context())
	return id.Scope, id.Key, ok
}

// pingCeleriant asks for the details of a seeded account: any answer, "not found"
// included, means Celeriant is reachable.
func (a *App) pingCeleriant(ctx context.Context) error {
	_, err := a.Events.AggregateDetails(ctx, accounts.Key(accounts.AliceID))
	if err != nil && !celeriant.IsNotFound(err) {
		return err
	}
	return nil
}

// Close releases everything Open opened, in reverse order. Call it after the HTTP
// server has shut down, so in-flight requests finish with their store and log.
func (a *App) Close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil
}

// ProtectedAPI is API behind ScopeGuard and the idempotency middleware, for net/http
// routers.
func (a *App) ProtectedAPI() http.Handler { return ScopeGuard(a.Idempotency.Handler(a.API)) }

// ScopeGuard answers 400 MALFORMED_REQUEST problem details, without calling next,
// when ScopeHeader is sent on several lines (which one is the principal?) or is
// longer than MaxScopeBytes. Put it in front of the idempotency middleware.
func ScopeGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Values(ScopeHeader); len(v) > 1 || len(v) == 1 && len(v[0]) > MaxScopeBytes {
			WriteProblem(w, http.StatusBadRequest, "MALFORMED_REQUEST",
				ScopeHeader+" must be sent once and be at most "+strconv.Itoa(MaxScopeBytes)+" bytes long.")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Healthz answers liveness: 200 "ok" while the process serves. GET and HEAD only
// (405 problem otherwise).
func (a *App) Healthz(w http.ResponseWriter, r *http.Request) {
	if !getOrHead(w, r) {
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte("ok\n"))
}

// Readyz answers readiness: it pings the idempotency store (for server-backed
// stores), Celeriant and the Postgres projection, each within 2 s, and answers
// 200 {"status":"ready","checks":{name:"ok"}} or 503 with "status":"unavailable"
// and the failing checks' errors. GET and HEAD only.
func (a *App) Readyz(w http.ResponseWriter, r *http.Request) {
	if !getOrHead(w, r) {
		return
	}
	out := struct {
		Status string            `json:"status"`
		Checks map[string]string `json:"checks"`
	}{Status: "ready", Checks: make(map[string]string, len(a.checks))}
	for _, c := range a.checks {
		ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
		err := c.fn(ctx)
		cancel()
		if err != nil {
			// The cause (addresses, database user) goes to the log, not to whoever
			// can reach the probe.
			out.Status = "unavailable"
			out.Checks[c.name] = "unavailable"
			a.Logger.WarnContext(r.Context(), "readiness check failed", "check", c.name, "err", err)
			continue
		}
		out.Checks[c.name] = "ok"
	}
	status := http.StatusOK
	if out.Status != "ready" {
		status = http.StatusServiceUnavailable
	}
	body, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// MetricsHandler serves Registry in the Prometheus text exposition format.
// GET and HEAD only.
func (a *App) MetricsHandler() http.Handler {
	h := promhttp.HandlerFor(a.Registry, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(a.Logger.Handler(), slog.LevelWarn), Registry: a.Registry,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if getOrHead(w, r) {
			h.ServeHTTP(w, r)
		}
	})
}

func getOrHead(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	WriteProblem(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "Method not allowed on this route.")
	return false
}

// WriteProblem answers an RFC 9457 problem in the shape of package httpapi's:
// type "urn:idemkey:problem:" + lower-case code, title the status text, status,
// detail and code. Routers use it for the errors they answer themselves (echo's
// 404 and 405).
func WriteProblem(w http.ResponseWriter, status int, code, detail string) {
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
		Code   string `json:"code"`
	}{httpapi.ProblemTypePrefix + strings.ToLower(code), http.StatusText(status), status, detail, code})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
