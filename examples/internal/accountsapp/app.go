// Package accountsapp is what the two account servers (examples/nethttp and
// examples/echo) share below their wiring: Celeriant (the wire client or the
// in-process simulator), the projection (memory, or Postgres on the shared pool),
// the seeded account service and its API, the /healthz, /readyz and /metrics
// probes, the X-Client-ID stand-in for authentication, and running the server
// (listening line, graceful shutdown). Each server's main.go builds the
// idempotency store, the metrics and the middleware itself and mounts the pieces
// on its router (a Wire).
package accountsapp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/examples/accounts"
	"github.com/idemkey/idemkey/examples/accounts/httpapi"
	"github.com/idemkey/idemkey/examples/accounts/watchfeed"
	"github.com/idemkey/idemkey/examples/internal/setup"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// ClientIDHeader is the request header the examples take as the authenticated
// principal (a stand-in for real authentication, docs/architecture.md section 6);
// AnonymousScope is the scope of a request without it.
const (
	ClientIDHeader = "X-Client-ID"
	AnonymousScope = "anonymous"
)

// MaxClientIDBytes is the longest ClientIDHeader value accepted, the idempotency
// key's own limit (store.MaxKeyLen): a longer one is a 400 MALFORMED_REQUEST
// answered before the middleware, so it claims nothing. (The middleware's own
// bound on a scope, store.MaxScopeLen, is higher.)
const MaxClientIDBytes = 255

// probeTimeout bounds each readiness check; seedTimeout bounds startup seeding.
const (
	probeTimeout = 2 * time.Second
	seedTimeout  = 30 * time.Second
)

// App is the account service with its probes. Build it with Open, mount its
// handlers on a router, and Close it after the HTTP server has drained.
type App struct {
	Env setup.Env
	// Store is the idempotency store the server built; /readyz pings it.
	Store store.Store
	// Events is the Celeriant event store: the wire client, or the simulator.
	Events celeriant.EventStore
	// Service is the account service over Events and the projection.
	Service *accounts.Service
	// API serves the routes of docs/architecture.md section 6 under /api, unprotected: put
	// the idempotency middleware in front of it. It answers unknown routes with
	// 404 problems and other methods with 405, both marked middleware.Unrouted so
	// that they release the request's key.
	API http.Handler
	// Registry holds the application's metrics (never the global registry): Open
	// adds the Go runtime and process collectors to the one it is given.
	Registry *prometheus.Registry
	// Feed is the live-update stream of GET /api/watch/stream: one Celeriant watch
	// on the seeded accounts, fanned out as Server-Sent Events. It stops, ending
	// every stream, when the context given to Open ends or Close runs.
	Feed *watchfeed.Feed

	// Logger is the application's logger.
	Logger *slog.Logger

	checks  []check
	closers []func()
}

// check is one readiness probe: nil means ready, an error wrapping
// store.ErrDegraded degraded but ready.
type check struct {
	name string
	fn   func(ctx context.Context) error
}

// Open builds the account service on env and conns: Celeriant (the wire client
// for env.CeleriantAddrs, else an in-process simulator), the projection (memory, or
// Postgres on conns.Pool, migrated at startup), the account service (seeded at
// startup; a failure to seed fails Open) and its API, the readiness checks (st,
// Celeriant, the Postgres projection) and the Go and process collectors in reg.
// It does not own st or conns. On error everything opened so far is closed.
func Open(ctx context.Context, env setup.Env, conns *setup.Conns, st store.Store, reg *prometheus.Registry, logger *slog.Logger) (a *App, err error) {
	a = &App{Env: env, Store: st, Registry: reg, Logger: logger}
	defer func() {
		if err != nil {
			a.Close()
			a = nil
		}
	}()
	a.checks = append(a.checks, check{"store", func(ctx context.Context) error { return store.Ping(ctx, st) }})

	if len(env.CeleriantAddrs) == 0 {
		sim := celeriantsim.New(celeriantsim.Options{Precision: env.TimestampPrecision})
		a.Events = sim
		a.closers = append(a.closers, func() { _ = sim.Close() })
	} else {
		client, err := celeriant.New(celeriant.Config{Addrs: env.CeleriantAddrs, Logger: logger, APIKey: env.APIKey, Identity: env.Identity})
		if err != nil {
			return a, fmt.Errorf("%w: CELERIANT_ADDR=%q: %w", setup.ErrConfig, strings.Join(env.CeleriantAddrs, ","), err)
		}
		a.Events = client
		a.closers = append(a.closers, func() { _ = client.Close() })
	}
	a.checks = append(a.checks, check{"celeriant", a.pingCeleriant})

	var proj accounts.Projection
	switch env.Projection {
	case "postgres":
		pg, err := accounts.NewPostgresProjection(conns.Pool, accounts.WithTablePrefix(env.TablePrefix),
			accounts.WithPostgresWindow(indexWindow(env.Retention)))
		if err != nil {
			return a, err
		}
		if err := pg.Migrate(ctx); err != nil {
			return a, fmt.Errorf("postgres projection: %w", err)
		}
		proj = pg
		a.checks = append(a.checks, check{"projection", conns.Pool.Ping})
	default:
		proj = accounts.NewMemoryProjection()
	}

	opts := []accounts.Option{accounts.WithLogger(logger), accounts.WithLandedLookback(env.Retention),
		accounts.WithTimestampPrecision(env.TimestampPrecision)}
	if env.ClientID != uuid.Nil {
		opts = append(opts, accounts.WithClientID(env.ClientID))
	}
	a.Service, err = accounts.New(a.Events, proj, opts...)
	if err != nil {
		return a, err
	}
	seedCtx, cancel := context.WithTimeout(ctx, seedTimeout)
	err = a.Service.Seed(seedCtx)
	cancel()
	if err != nil {
		return a, fmt.Errorf("seeding the accounts (is Celeriant at %q up?): %w", strings.Join(env.CeleriantAddrs, ","), err)
	}
	if sim, ok := a.Events.(*celeriantsim.Sim); ok && env.SimDelay > 0 {
		sim.SetDelay(env.SimDelay)
	}

	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return a, err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return a, err
	}
	if err := a.startFeed(ctx); err != nil {
		return a, err
	}
	a.API = httpapi.New(a.Service, httpapi.WithLogger(logger), httpapi.WithKeyFunc(keyFromRequest),
		httpapi.WithLandedFunc(takeoverFromRequest), httpapi.WithWatchStream(a.Feed),
		// The API's own 404 and 405 release the key (the middleware sits in front).
		httpapi.WithUnrouted(middleware.Unrouted))
	return a, nil
}

// feedReadyTimeout bounds Open's wait for the feed's first subscription: a browser
// that connects later sees every commit from then on; one that connects before may
// miss a commit made in between. Past it the feed keeps trying in the background.
const feedReadyTimeout = 5 * time.Second

// startFeed starts the live-update feed on the seeded accounts (the reference's
// choice) and waits, up to feedReadyTimeout, for Celeriant to acknowledge it.
func (a *App) startFeed(ctx context.Context) error {
	w, ok := a.Events.(celeriant.Watcher)
	if !ok {
		return fmt.Errorf("the event store %T cannot watch", a.Events)
	}
	seeded := accounts.SeededAccounts()
	ids := make([]uuid.UUID, len(seeded))
	for i, acct := range seeded {
		ids[i] = acct.ID
	}
	feed, err := watchfeed.New(w, watchfeed.Options{Org: accounts.OrgID, Type: accounts.AccountTypeID, Accounts: ids,
		Versions: a.accountVersion, Logger: a.Logger})
	if err != nil {
		return err
	}
	feed.Start(ctx)
	a.closers = append(a.closers, feed.Close)
	a.Feed = feed
	t := time.NewTimer(feedReadyTimeout)
	defer t.Stop()
	select {
	case <-feed.Ready():
	case <-t.C:
		a.Logger.WarnContext(ctx, "the live-update feed is not subscribed yet; it keeps trying", "waited", feedReadyTimeout)
	case <-ctx.Done():
	}
	return nil
}

// accountVersion is an account's current version in Celeriant (0 when it has none).
func (a *App) accountVersion(ctx context.Context, acct uuid.UUID) (uint64, error) {
	d, err := a.Events.AggregateDetails(ctx, accounts.Key(acct))
	if celeriant.IsNotFound(err) {
		return 0, nil
	}
	return d.MaxVersion, err
}

// takeoverFromRequest tells the account service that the request's claim took over an
// expired lease: the previous holder may have written before it died, so the service
// searches the stream for the request's event before writing.
func takeoverFromRequest(r *http.Request) bool {
	c, ok := claim.FromContext(r.Context())
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

// ClientID is the examples' stand-in for an authentication middleware: it takes
// the ClientIDHeader value as the request's authenticated principal
// (middleware.ContextWithPrincipal; none when the header is absent or empty), so the
// idempotency middleware behind it scopes keys with
// middleware.ScopeFromPrincipal(AnonymousScope). A real service checks
// credentials here instead: any client can send any X-Client-ID. It answers 400
// MALFORMED_REQUEST problem details, without calling next, when the header is
// sent on several lines (which one is the principal?) or is longer than
// MaxClientIDBytes.
func ClientID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Values(ClientIDHeader)
		if len(v) > 1 || len(v) == 1 && len(v[0]) > MaxClientIDBytes {
			httpapi.WriteProblem(w, http.StatusBadRequest, "MALFORMED_REQUEST",
				ClientIDHeader+" must be sent once and be at most "+strconv.Itoa(MaxClientIDBytes)+" bytes long.")
			return
		}
		if len(v) == 1 && v[0] != "" {
			r = r.WithContext(middleware.ContextWithPrincipal(r.Context(), v[0]))
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

// Readiness states, in the "status" member and per check.
const (
	ready       = "ready"
	degraded    = "degraded"
	unavailable = "unavailable"
)

// Readyz answers readiness. It runs each check within 2 s: the idempotency store
// (store.Ping; the memory store is always up, a store without Ping too), Celeriant
// and the Postgres projection, and answers JSON {"status":S,"checks":{name:C}}:
//
//	every check "ok"                         200, status "ready"
//	a check "degraded", none "unavailable"   200, status "degraded": the store serves
//	                                         with a part down (the tiered store's
//	                                         Redis: store.ErrDegraded), still ready
//	a check "unavailable"                    503, status "unavailable"
//
// A failing check's cause (addresses, database user) goes to the log, not to
// whoever can reach the probe; a degraded store is not logged here (the tiered
// store logs its outage once). GET and HEAD only.
func (a *App) Readyz(w http.ResponseWriter, r *http.Request) {
	if !getOrHead(w, r) {
		return
	}
	out := struct {
		Status string            `json:"status"`
		Checks map[string]string `json:"checks"`
	}{Status: ready, Checks: make(map[string]string, len(a.checks))}
	for _, c := range a.checks {
		ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
		err := c.fn(ctx)
		cancel()
		switch {
		case err == nil:
			out.Checks[c.name] = "ok"
		case errors.Is(err, store.ErrDegraded):
			out.Checks[c.name] = degraded
			if out.Status == ready {
				out.Status = degraded
			}
		default:
			out.Checks[c.name] = unavailable
			out.Status = unavailable
			a.Logger.WarnContext(r.Context(), "readiness check failed", "check", c.name, "err", err)
		}
	}
	status := http.StatusOK
	if out.Status == unavailable {
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
	httpapi.WriteProblem(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "Method not allowed on this route.")
	return false
}
