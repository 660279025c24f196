package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/idemkey/idemkey/claim"
)

// errConfig reports an environment the server cannot run with; main exits 2.
var errConfig = errors.New("payments: bad configuration")

// Defaults of the environment.
const (
	defaultAddr      = "127.0.0.1:8080"
	defaultLease     = 10 * time.Second
	defaultRetention = 24 * time.Hour
	defaultTokens    = "demo=merchant-demo"
)

// config is the environment the server runs with (see the package doc).
type config struct {
	addr        string
	databaseURL string
	// gatewayURL is the payment provider's base URL; empty runs the fake gateway
	// in-process.
	gatewayURL string
	// lease and retention are the middleware's (IDEM_LEASE, IDEM_RETENTION).
	lease, retention time.Duration
	// tablePrefix prefixes "payments" and "idemkey_records".
	tablePrefix string
	// tokens maps a bearer token to its principal, the scope of its keys.
	tokens map[string]string
	// faults enables the X-Fault request header (PAYMENTS_FAULTS=1).
	faults bool
	// webhookSecret verifies the provider's webhooks (PAYMENTS_WEBHOOK_SECRET);
	// empty: POST /webhooks answers 404.
	webhookSecret string
	// webhookTolerance is the largest age (or skew) of a webhook's signature
	// timestamp (PAYMENTS_WEBHOOK_TOLERANCE).
	webhookTolerance time.Duration
}

var (
	prefixRE    = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,31}$`)
	principalRE = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)
)

// loadConfig reads the config from getenv. Errors wrap errConfig and name the
// variable.
func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		addr:        defaultAddr,
		databaseURL: strings.TrimSpace(getenv("DATABASE_URL")),
		gatewayURL:  strings.TrimSpace(getenv("GATEWAY_URL")),
		lease:       defaultLease,
		retention:   defaultRetention,
		tablePrefix: strings.TrimSpace(getenv("PAYMENTS_TABLE_PREFIX")),

		webhookSecret:    getenv("PAYMENTS_WEBHOOK_SECRET"),
		webhookTolerance: defaultWebhookSkew,
	}
	if v := strings.TrimSpace(getenv("ADDR")); v != "" {
		c.addr = v
	}
	if c.databaseURL == "" {
		return c, fmt.Errorf("%w: DATABASE_URL is required: the payments and the idempotency records live in Postgres "+
			"(e.g. DATABASE_URL='postgres://postgres@127.0.0.1:5432/test?sslmode=disable')", errConfig)
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{"IDEM_LEASE", &c.lease}, {"IDEM_RETENTION", &c.retention}, {"PAYMENTS_WEBHOOK_TOLERANCE", &c.webhookTolerance}} {
		v := strings.TrimSpace(getenv(d.name))
		if v == "" {
			continue
		}
		parsed, err := time.ParseDuration(v)
		if err != nil || parsed <= 0 {
			return c, fmt.Errorf("%w: %s=%q: want a positive Go duration such as 10s", errConfig, d.name, v)
		}
		*d.dst = parsed
	}
	if c.lease < claim.MinLease {
		return c, fmt.Errorf("%w: IDEM_LEASE=%v is under the minimum lease %v (it is renewed every third of it)", errConfig, c.lease, claim.MinLease)
	}
	if c.retention < c.lease {
		return c, fmt.Errorf("%w: IDEM_RETENTION (%v) must be at least IDEM_LEASE (%v)", errConfig, c.retention, c.lease)
	}
	if c.tablePrefix != "" && !prefixRE.MatchString(c.tablePrefix) {
		return c, fmt.Errorf("%w: PAYMENTS_TABLE_PREFIX=%q: want at most 32 lower-case letters, digits and underscores, not starting with a digit", errConfig, c.tablePrefix)
	}
	tokens := getenv("PAYMENTS_TOKENS")
	if strings.TrimSpace(tokens) == "" {
		tokens = defaultTokens
	}
	var err error
	if c.tokens, err = parseTokens(tokens); err != nil {
		return c, err
	}
	switch v := strings.TrimSpace(getenv("PAYMENTS_FAULTS")); v {
	case "", "0":
	case "1":
		c.faults = true
	default:
		return c, fmt.Errorf("%w: PAYMENTS_FAULTS=%q: want 1 (the X-Fault header is honoured) or 0", errConfig, v)
	}
	return c, nil
}

// parseTokens parses PAYMENTS_TOKENS, "token=principal,token=principal".
func parseTokens(v string) (map[string]string, error) {
	tokens := make(map[string]string)
	for _, entry := range strings.Split(v, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		token, principal, ok := strings.Cut(entry, "=")
		token, principal = strings.TrimSpace(token), strings.TrimSpace(principal)
		switch {
		case !ok || token == "" || principal == "":
			return nil, fmt.Errorf("%w: PAYMENTS_TOKENS: entry %q: want token=principal", errConfig, entry)
		case strings.ContainsAny(token, " \t"):
			return nil, fmt.Errorf("%w: PAYMENTS_TOKENS: a token must not contain blanks", errConfig)
		case !principalRE.MatchString(principal):
			return nil, fmt.Errorf("%w: PAYMENTS_TOKENS: principal %q: want 1-64 letters, digits and . _ @ -", errConfig, principal)
		}
		if _, dup := tokens[token]; dup {
			return nil, fmt.Errorf("%w: PAYMENTS_TOKENS: a token is listed twice", errConfig)
		}
		tokens[token] = principal
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("%w: PAYMENTS_TOKENS lists no token", errConfig)
	}
	return tokens, nil
}
