// Package accountsapp is what the two account servers (examples/nethttp and
// examples/echo) share: the configuration of docs/architecture.md section 6 read from the
// environment, the wiring of idempotency store, Celeriant, projection, account
// service and middleware, the Prometheus observer, the /healthz, /readyz and
// /metrics probes, and the HTTP server with its listening line and graceful
// shutdown. A server only mounts the pieces on its router (a Mount).
//
// Environment (docs/architecture.md section 6, plus the test-only table names):
//
//	ADDR                   listen address, default 127.0.0.1:8080
//	IDEM_STORE             memory (default), postgres, redis or tiered (package storeenv)
//	DATABASE_URL           Postgres: the store (postgres, tiered) and PROJECTION=postgres
//	REDIS_URL              Redis: the store (redis, tiered)
//	CELERIANT_ADDR         Celeriant wire address host:port; empty: in-process simulator
//	PROJECTION             memory (default) or postgres
//	IDEM_LEASE             claim lease, Go duration, default 10s
//	IDEM_RETENTION         how long responses are replayed, default 24h
//	IDEM_TABLE             Postgres store table (storeenv), default idemkey_records
//	IDEM_REDIS_PREFIX      Redis store key prefix (storeenv)
//	ACCOUNTS_TABLE_PREFIX  prefix of the Postgres projection's tables, default none
//	CELERIANT_SIM_DELAY    latency the in-process simulator adds to every call after
//	                       startup, Go duration, default 0 (demos: makes a 409 easy to see)
package accountsapp

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrConfig reports an environment the servers cannot run with.
var ErrConfig = errors.New("accountsapp: bad configuration")

// Defaults of the environment (docs/architecture.md section 6).
const (
	DefaultAddr      = "127.0.0.1:8080"
	DefaultLease     = 10 * time.Second
	DefaultRetention = 24 * time.Hour
)

// Config is the environment a server runs with. The idempotency store's own
// variables (IDEM_STORE, REDIS_URL, IDEM_TABLE, ...) are read by package storeenv.
type Config struct {
	// Addr is the listen address (ADDR); port 0 picks a free port.
	Addr string
	// Lease and Retention are the middleware's claim lease and record retention
	// (IDEM_LEASE, IDEM_RETENTION); Retention >= Lease > 0.
	Lease, Retention time.Duration
	// CeleriantAddr is the Celeriant wire address (CELERIANT_ADDR); empty runs the
	// in-process simulator, whose log lives and dies with the process.
	CeleriantAddr string
	// Projection is "memory" or "postgres" (PROJECTION).
	Projection string
	// DatabaseURL is the Postgres connection string (DATABASE_URL); required by
	// PROJECTION=postgres.
	DatabaseURL string
	// TablePrefix prefixes the Postgres projection's tables (ACCOUNTS_TABLE_PREFIX),
	// so tests and several deployments can share one database.
	TablePrefix string
	// SimDelay is added by the in-process simulator to every call once the
	// accounts are seeded (CELERIANT_SIM_DELAY); only without CeleriantAddr.
	SimDelay time.Duration
}

// LoadConfig reads the Config from getenv (os.Getenv in a server). Errors wrap
// ErrConfig and name the variable: a duration that is not a positive Go duration,
// a retention shorter than the lease, an unknown projection, PROJECTION=postgres
// without DATABASE_URL.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := Config{
		Addr:          DefaultAddr,
		Lease:         DefaultLease,
		Retention:     DefaultRetention,
		CeleriantAddr: strings.TrimSpace(getenv("CELERIANT_ADDR")),
		Projection:    strings.ToLower(strings.TrimSpace(getenv("PROJECTION"))),
		DatabaseURL:   getenv("DATABASE_URL"),
		TablePrefix:   getenv("ACCOUNTS_TABLE_PREFIX"),
	}
	if v := strings.TrimSpace(getenv("ADDR")); v != "" {
		c.Addr = v
	}
	for _, d := range []struct {
		name   string
		dst    *time.Duration
		zeroOK bool
	}{{"IDEM_LEASE", &c.Lease, false}, {"IDEM_RETENTION", &c.Retention, false}, {"CELERIANT_SIM_DELAY", &c.SimDelay, true}} {
		v := strings.TrimSpace(getenv(d.name))
		if v == "" {
			continue
		}
		parsed, err := time.ParseDuration(v)
		if err != nil || parsed < 0 || parsed == 0 && !d.zeroOK {
			want := "a positive"
			if d.zeroOK {
				want = "a non-negative"
			}
			return c, fmt.Errorf("%w: %s=%q: want %s Go duration such as 10s", ErrConfig, d.name, v, want)
		}
		*d.dst = parsed
	}
	if c.Retention < c.Lease {
		return c, fmt.Errorf("%w: IDEM_RETENTION (%v) must be at least IDEM_LEASE (%v)", ErrConfig, c.Retention, c.Lease)
	}
	if c.SimDelay > 0 && c.CeleriantAddr != "" {
		return c, fmt.Errorf("%w: CELERIANT_SIM_DELAY applies to the in-process simulator only, not CELERIANT_ADDR", ErrConfig)
	}
	switch c.Projection {
	case "":
		c.Projection = "memory"
	case "memory":
	case "postgres":
		if c.DatabaseURL == "" {
			return c, fmt.Errorf("%w: PROJECTION=postgres needs DATABASE_URL", ErrConfig)
		}
	default:
		return c, fmt.Errorf("%w: PROJECTION=%q is not one of memory, postgres", ErrConfig, c.Projection)
	}
	return c, nil
}
