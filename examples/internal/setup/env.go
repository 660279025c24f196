// Package setup is what every example's main.go starts with: the environment of
// docs/architecture.md section 6, parsed once (Load), and the connections it names,
// opened once (Connect): one Postgres pool, shared by the idempotency store and
// the account projection, and one Redis client. The examples build their stores,
// middleware and routes on these in their main.go, in plain sight.
//
// Environment (docs/architecture.md section 6, plus the test-only names):
//
//	ADDR                   listen address, default 127.0.0.1:8080
//	IDEM_STORE             memory (default), postgres, redis, tiered, mysql or dynamodb
//	DATABASE_URL           Postgres: the store (postgres, tiered) and PROJECTION=postgres
//	REDIS_URL              Redis: the store (redis, tiered)
//	MYSQL_DSN              MySQL or MariaDB (go-sql-driver DSN): the mysql store
//	AWS_REGION             DynamoDB's region (the dynamodb store; credentials as the
//	                       AWS SDK finds them)
//	DYNAMODB_ENDPOINT      a DynamoDB-compatible endpoint (dynalite, DynamoDB Local)
//	                       instead of AWS's; region us-east-1 unless AWS_REGION
//	IDEM_LEASE             claim lease, Go duration, at least 100ms, default 10s
//	IDEM_RETENTION         how long responses are replayed, default 24h
//	IDEM_WAIT              how long a duplicate of a request in flight waits for its
//	                       answer (middleware.WithWaitInFlight), Go duration, default
//	                       5s; 0 answers 409 at once (the account examples)
//	IDEM_MEMORY_MAX_BYTES  the memory store's bound on the bytes it keeps
//	                       (memory.WithMaxBytes), default 67108864 (64 MiB); 0: none
//	IDEM_TABLE             the Postgres, MySQL or DynamoDB store's table, default idemkey_records
//	IDEM_REDIS_PREFIX      the Redis store's key prefix, default idemkey:
//	CELERIANT_ADDR         Celeriant wire address host:port, or a cluster's nodes
//	                       separated by commas; empty: in-process simulator
//	CELERIANT_TIMESTAMP_PRECISION
//	                       the Celeriant server's --timestamp-precision: ms (default),
//	                       us or ns; the simulator stamps in it; a server that stamps
//	                       in another stops the service at startup
//	CELERIANT_API_KEY      API key (standard base64 of 32 bytes) sent in the Identify
//	                       handshake of every connection; empty: no handshake. Never
//	                       logged
//	CELERIANT_IDENTITY_KEY a file holding an RSA private key (PEM, or Celeriant's base64
//	                       PKCS#8) the client proves in the Identify handshake of every
//	                       connection; the service then writes under its client id
//	CELERIANT_CLIENT_ID    the Celeriant client id (a UUID) the account service writes
//	                       under, shared by all its replicas; default the identity's,
//	                       else the service's own
//	PROJECTION             memory (default) or postgres
//	ACCOUNTS_TABLE_PREFIX  prefix of the Postgres projection's tables, default none
//	CELERIANT_SIM_DELAY    latency the in-process simulator adds to every call after
//	                       startup, Go duration, default 0 (demos: makes a 409 easy to see)
//	IDEM_REPLAY_HEADER     the conformance fixture's replay header, default
//	                       Idempotent-Replayed
package setup

import (
	"crypto/rsa"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
)

// ErrConfig reports an environment the examples cannot run with.
var ErrConfig = errors.New("setup: bad configuration")

// Defaults of the environment (docs/architecture.md section 6).
const (
	DefaultAddr      = "127.0.0.1:8080"
	DefaultLease     = 10 * time.Second
	DefaultRetention = 24 * time.Hour
	DefaultWait      = 5 * time.Second
)

// Env is the environment an example runs with, parsed once by Load.
type Env struct {
	// Addr is the listen address (ADDR); port 0 picks a free port.
	Addr string
	// Store is the idempotency store (IDEM_STORE): "memory", "postgres", "redis",
	// "tiered" (Redis in front of Postgres), "mysql" (MySQL or MariaDB) or
	// "dynamodb".
	Store string
	// DatabaseURL is the Postgres connection string (DATABASE_URL); required by
	// the postgres and tiered stores and by PROJECTION=postgres.
	DatabaseURL string
	// RedisURL is the Redis URL (REDIS_URL); required by the redis and tiered
	// stores.
	RedisURL string
	// MySQLDSN is the MySQL/MariaDB DSN of github.com/go-sql-driver/mysql
	// (MYSQL_DSN), such as app@tcp(127.0.0.1:3306)/app; required by the mysql
	// store.
	MySQLDSN string
	// AWSRegion (AWS_REGION) and DynamoDBEndpoint (DYNAMODB_ENDPOINT) locate the
	// dynamodb store's table; it needs one of them.
	AWSRegion, DynamoDBEndpoint string
	// Lease and Retention are the middleware's claim lease and record retention
	// (IDEM_LEASE, IDEM_RETENTION); Retention >= Lease > 0.
	Lease, Retention time.Duration
	// Wait bounds how long a duplicate of a request in flight waits for the
	// original's answer (IDEM_WAIT, middleware.WithWaitInFlight); 0: no waiting.
	Wait time.Duration
	// MemoryMaxBytes bounds the bytes the memory store keeps
	// (IDEM_MEMORY_MAX_BYTES, memory.WithMaxBytes); 0: no bound. When full, new
	// keys are answered 503 until records expire.
	MemoryMaxBytes int64
	// IdemTable is the Postgres or MySQL store's table (IDEM_TABLE), so tests and several
	// deployments can share one database.
	IdemTable string
	// RedisPrefix prefixes the Redis store's keys (IDEM_REDIS_PREFIX).
	RedisPrefix string
	// CeleriantAddrs are the Celeriant nodes' wire addresses (CELERIANT_ADDR, comma
	// separated); none runs the in-process simulator, whose log lives and dies with
	// the process.
	CeleriantAddrs []string
	// TimestampPrecision is the Celeriant server's timestamp precision
	// (CELERIANT_TIMESTAMP_PRECISION: ms, us or ns; default ms): the protocol does
	// not carry it (docs/celeriant-protocol.md section 6.8).
	TimestampPrecision celeriant.Precision
	// APIKey is the Celeriant API key (CELERIANT_API_KEY), sent in the Identify
	// handshake; it formats and logs as [redacted].
	APIKey celeriant.Secret
	// Identity is the RSA key of CELERIANT_IDENTITY_KEY, nil without one.
	Identity *rsa.PrivateKey
	// ClientID is the Celeriant client id the account service writes under
	// (CELERIANT_CLIENT_ID); uuid.Nil keeps the service's default. Every replica must
	// use the same one, and it must not change once events exist
	// (docs/celeriant-protocol.md section 6.4).
	ClientID uuid.UUID
	// Projection is "memory" or "postgres" (PROJECTION).
	Projection string
	// TablePrefix prefixes the Postgres projection's tables (ACCOUNTS_TABLE_PREFIX).
	TablePrefix string
	// SimDelay is added by the in-process simulator to every call once the
	// accounts are seeded (CELERIANT_SIM_DELAY); only without CeleriantAddr.
	SimDelay time.Duration
	// ReplayHeader is the header marking a replay in the conformance fixture
	// (IDEM_REPLAY_HEADER); empty keeps the middleware's default.
	ReplayHeader string
}

// NeedsPostgres reports whether env names Postgres: the postgres or tiered store,
// or the Postgres projection.
func (e Env) NeedsPostgres() bool {
	return e.Store == "postgres" || e.Store == "tiered" || e.Projection == "postgres"
}

// NeedsRedis reports whether env names Redis: the redis or tiered store.
func (e Env) NeedsRedis() bool { return e.Store == "redis" || e.Store == "tiered" }

// Load reads the Env from getenv (os.Getenv in a server). Errors wrap ErrConfig
// and name the variable: an unknown store or projection, a store or projection
// without the server URL it needs, a duration that is not a positive Go duration
// (IDEM_WAIT, CELERIANT_SIM_DELAY: non-negative), a retention shorter than the lease,
// an IDEM_MEMORY_MAX_BYTES that is not a non-negative integer,
// CELERIANT_SIM_DELAY with CELERIANT_ADDR.
func Load(getenv func(string) string) (Env, error) {
	e := Env{
		Addr:           DefaultAddr,
		Store:          strings.ToLower(strings.TrimSpace(getenv("IDEM_STORE"))),
		DatabaseURL:    getenv("DATABASE_URL"),
		RedisURL:       getenv("REDIS_URL"),
		MySQLDSN:       getenv("MYSQL_DSN"),
		Lease:          DefaultLease,
		Retention:      DefaultRetention,
		Wait:           DefaultWait,
		MemoryMaxBytes: memory.DefaultMaxBytes,
		IdemTable:      getenv("IDEM_TABLE"),
		RedisPrefix:    getenv("IDEM_REDIS_PREFIX"),
		CeleriantAddrs: splitAddrs(getenv("CELERIANT_ADDR")),
		Projection:     strings.ToLower(strings.TrimSpace(getenv("PROJECTION"))),
		TablePrefix:    getenv("ACCOUNTS_TABLE_PREFIX"),
		ReplayHeader:   strings.TrimSpace(getenv("IDEM_REPLAY_HEADER")),
	}
	e.AWSRegion, e.DynamoDBEndpoint = strings.TrimSpace(getenv("AWS_REGION")), strings.TrimSpace(getenv("DYNAMODB_ENDPOINT"))
	if v := strings.TrimSpace(getenv("ADDR")); v != "" {
		e.Addr = v
	}
	if err := e.loadCeleriant(getenv); err != nil {
		return e, err
	}
	if e.IdemTable == "" {
		e.IdemTable = postgres.DefaultTable
	}
	if e.RedisPrefix == "" {
		e.RedisPrefix = redis.DefaultPrefix
	}
	if err := e.loadDurations(getenv); err != nil {
		return e, err
	}
	if err := parseBytes(getenv, "IDEM_MEMORY_MAX_BYTES", &e.MemoryMaxBytes); err != nil {
		return e, err
	}
	if e.Lease < claim.MinLease {
		return e, fmt.Errorf("%w: IDEM_LEASE=%v is under the minimum lease %v (it is renewed every third of it)", ErrConfig, e.Lease, claim.MinLease)
	}
	if e.Retention < e.Lease {
		return e, fmt.Errorf("%w: IDEM_RETENTION (%v) must be at least IDEM_LEASE (%v)", ErrConfig, e.Retention, e.Lease)
	}
	if e.SimDelay > 0 && len(e.CeleriantAddrs) > 0 {
		return e, fmt.Errorf("%w: CELERIANT_SIM_DELAY applies to the in-process simulator only, not CELERIANT_ADDR", ErrConfig)
	}
	err := e.check() // defaults the store and projection: before e is returned
	return e, err
}

// loadDurations reads IDEM_LEASE, IDEM_RETENTION (positive), IDEM_WAIT and
// CELERIANT_SIM_DELAY (non-negative), each a Go duration such as 10s.
func (e *Env) loadDurations(getenv func(string) string) error {
	for _, d := range []struct {
		name   string
		dst    *time.Duration
		zeroOK bool
	}{{"IDEM_LEASE", &e.Lease, false}, {"IDEM_RETENTION", &e.Retention, false}, {"IDEM_WAIT", &e.Wait, true}, {"CELERIANT_SIM_DELAY", &e.SimDelay, true}} {
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
			return fmt.Errorf("%w: %s=%q: want %s Go duration such as 10s", ErrConfig, d.name, v, want)
		}
		*d.dst = parsed
	}
	return nil
}

// check validates the store and projection names and that each has the server
// URL it needs; it defaults both to memory.
func (e *Env) check() error {
	switch e.Store {
	case "":
		e.Store = "memory"
	case "memory", "postgres", "redis", "tiered", "mysql", "dynamodb":
	default:
		return fmt.Errorf("%w: IDEM_STORE=%q is not one of memory, postgres, redis, tiered, mysql, dynamodb", ErrConfig, e.Store)
	}
	switch e.Projection {
	case "":
		e.Projection = "memory"
	case "memory", "postgres":
	default:
		return fmt.Errorf("%w: PROJECTION=%q is not one of memory, postgres", ErrConfig, e.Projection)
	}
	if e.NeedsPostgres() && e.DatabaseURL == "" {
		return fmt.Errorf("%w: %s needs DATABASE_URL", ErrConfig, e.postgresUser())
	}
	if e.Store == "mysql" && e.MySQLDSN == "" {
		return fmt.Errorf("%w: IDEM_STORE=mysql needs MYSQL_DSN", ErrConfig)
	}
	if e.Store == "dynamodb" && e.AWSRegion == "" && e.DynamoDBEndpoint == "" {
		return fmt.Errorf("%w: IDEM_STORE=dynamodb needs AWS_REGION or DYNAMODB_ENDPOINT", ErrConfig)
	}
	if e.NeedsRedis() && e.RedisURL == "" {
		return fmt.Errorf("%w: IDEM_STORE=%s needs REDIS_URL", ErrConfig, e.Store)
	}
	return nil
}

// loadCeleriant reads the Celeriant settings beyond CELERIANT_ADDR.
func (e *Env) loadCeleriant(getenv func(string) string) error {
	p, err := celeriant.ParsePrecision(getenv("CELERIANT_TIMESTAMP_PRECISION"))
	if err != nil {
		return fmt.Errorf("%w: CELERIANT_TIMESTAMP_PRECISION: %w", ErrConfig, err)
	}
	e.TimestampPrecision = p
	if v := strings.TrimSpace(getenv("CELERIANT_API_KEY")); v != "" {
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil || len(b) != celeriant.APIKeySize {
			return fmt.Errorf("%w: CELERIANT_API_KEY: want standard base64 of %d bytes", ErrConfig, celeriant.APIKeySize)
		}
		e.APIKey = celeriant.Secret(v)
	}
	if v := strings.TrimSpace(getenv("CELERIANT_CLIENT_ID")); v != "" {
		id, err := uuid.Parse(v)
		if err != nil || id == uuid.Nil {
			return fmt.Errorf("%w: CELERIANT_CLIENT_ID=%q: want a non-nil UUID", ErrConfig, v)
		}
		e.ClientID = id
	}
	if v := strings.TrimSpace(getenv("CELERIANT_IDENTITY_KEY")); v != "" {
		key, err := celeriant.LoadIdentity(v)
		if err != nil {
			return fmt.Errorf("%w: CELERIANT_IDENTITY_KEY: %w", ErrConfig, err)
		}
		id, err := celeriant.IdentityClientID(&key.PublicKey)
		if err != nil {
			return fmt.Errorf("%w: CELERIANT_IDENTITY_KEY: %w", ErrConfig, err)
		}
		if e.ClientID != uuid.Nil && e.ClientID != id {
			return fmt.Errorf("%w: CELERIANT_CLIENT_ID=%s but the server binds CELERIANT_IDENTITY_KEY's connections to client id %s (unset CELERIANT_CLIENT_ID)", ErrConfig, e.ClientID, id)
		}
		e.Identity, e.ClientID = key, id
	}
	return nil
}

// splitAddrs splits CELERIANT_ADDR's comma-separated nodes, dropping blanks.
func splitAddrs(v string) []string {
	var addrs []string
	for a := range strings.SplitSeq(v, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

// postgresUser names the setting that needs Postgres, for errors.
func (e Env) postgresUser() string {
	if e.Store == "postgres" || e.Store == "tiered" {
		return "IDEM_STORE=" + e.Store
	}
	return "PROJECTION=postgres"
}

// parseBytes sets *dst to the non-negative integer the variable name holds,
// if it is set.
func parseBytes(getenv func(string) string, name string, dst *int64) error {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("%w: %s=%q: want a non-negative number of bytes such as 67108864 (0: no bound)", ErrConfig, name, v)
	}
	*dst = n
	return nil
}
