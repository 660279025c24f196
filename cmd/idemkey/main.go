// Command idemkey is the operator's tool for one idempotency key: it shows the
// key's record and evicts it, on the Postgres store, the Redis store or the
// tiered pair (store.Inspector).
//
//	go run ./cmd/idemkey inspect [flags] [scope] key
//	go run ./cmd/idemkey evict   [flags] [scope] key
//
// The scope and key are the ones the middleware stored: the scope is the
// principal (in the examples the X-Client-ID header, "anonymous" when absent),
// the key the Idempotency-Key value without its Structured Field quotes. Give
// them as arguments or as -scope and -key, in any mix (with -key or -header the
// one argument is the scope); -header takes the header value as the client sent
// it ("\"order-1\"") and parses it as the middleware does. Flags may come
// before or after the arguments; "--" ends the flags.
//
// The store comes from the environment, as in the examples: DATABASE_URL (the
// Postgres store; IDEM_TABLE names its table, default idemkey_records; -schema
// its schema) and REDIS_URL (the Redis store; IDEM_REDIS_PREFIX its key prefix,
// default "idemkey:"). With both set the store is tiered (Postgres decides,
// Redis is its cache), unless IDEM_STORE or -store names postgres or redis.
// Flags -table and -prefix override the variables.
//
// inspect prints the record: state (absent, in_flight or completed),
// fingerprint, created, completed and expiry times, the lease deadline of an
// in-flight record and the stored status and body size. Times are the store's
// clock, in UTC. A tiered inspect also shows what Redis holds.
//
// evict removes a completed record, or an in-flight one whose lease has
// expired; it refuses one whose lease is live (a request may still be running
// the handler) unless -force is given. After an eviction the key is new: the
// next request with it runs the handler again. The decision and the removal are
// one statement (Postgres) or one script (Redis).
//
// Both print what they found and did, in lines for people or, with -json, as
// one JSON object. Exit status:
//
//	0  inspect found a record; evict removed one
//	1  inspect found no record; evict found none, or refused a live lease
//	2  usage: bad flags or arguments, no store configured, an invalid key
//	3  the store failed: unreachable, timed out, a missing table, a corrupt
//	   record; or a tiered evict removed the record from Postgres but could not
//	   drop the Redis copy (the report says so; evict again once Redis is back)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/tiered"
)

// Exit statuses.
const (
	exitDone     = 0
	exitNotFound = 1 // or refused
	exitUsage    = 2
	exitFailed   = 3
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

const usage = `usage: idemkey inspect [flags] [scope] key
       idemkey inspect [flags] -key key|-header value [scope]
       idemkey evict [-force] [flags] [scope] key
       idemkey evict [-force] [flags] -key key|-header value [scope]

The scope is an argument or -scope (default empty, the global scope); flags
may come before or after the arguments, and "--" ends them.

Shows or evicts the idempotency record of one key. The store comes from
DATABASE_URL (Postgres; IDEM_TABLE), REDIS_URL (Redis; IDEM_REDIS_PREFIX), or
both (tiered); IDEM_STORE or -store picks one when both are set.

Exit status: 0 found / evicted, 1 not found / refused, 2 usage, 3 store failure.
`

// parseInterleaved parses args with fs, flags and arguments in any order (Go's
// flag package stops at the first argument), and returns the arguments in
// order. After "--" everything is an argument. A bad flag is a usageError;
// -h is flag.ErrHelp.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
			return nil, err
		} else if err != nil {
			return nil, usageError{err.Error()}
		}
		rest := fs.Args()
		if n := len(args) - len(rest); len(rest) == 0 || n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// identify sets cfg.id from the arguments ([scope] key, or [scope] alone when
// -key or -header gives the key) and the -scope, -key and -header flags.
func (cfg *config) identify(pos []string, key, header string, scopeSet bool) error {
	byFlag := 0
	for _, s := range []string{key, header} {
		if s != "" {
			byFlag++
		}
	}
	if len(pos) > 2 {
		return usagef("too many arguments %q: want [scope] key, or [scope] with -key or -header", pos)
	}
	if byFlag > 1 || byFlag == 1 && len(pos) == 2 {
		return usagef("the key is given twice (-key, -header or an argument)")
	}
	if byFlag == 0 && len(pos) > 0 {
		cfg.id.Key, pos = pos[len(pos)-1], pos[:len(pos)-1]
	}
	if len(pos) == 1 {
		if scopeSet {
			return usagef("the scope is given twice (-scope and an argument)")
		}
		cfg.id.Scope = pos[0]
	}
	switch {
	case header != "":
		k, err := middleware.ParseKey(header)
		if err != nil {
			return usagef("-header: %v", err)
		}
		cfg.id.Key = k
	case key != "":
		cfg.id.Key = key
	}
	return nil
}

// config is one invocation, parsed.
type config struct {
	cmd     string // "inspect" or "evict"
	id      store.ID
	kind    string // "postgres", "redis" or "tiered"
	dbURL   string
	redis   string
	table   string
	schema  string
	prefix  string
	json    bool
	force   bool
	timeout time.Duration
}

// usageError is a mistake of the caller: exit 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// run is the command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	cfg, err := parse(args, stderr, getenv)
	if errors.Is(err, flag.ErrHelp) {
		return exitDone
	}
	if err != nil {
		fmt.Fprintln(stderr, "idemkey:", err)
		fmt.Fprintln(stderr, "run 'idemkey -h' for usage")
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	st, err := open(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "idemkey:", err)
		return exitFailed
	}
	defer st.close()

	rep := report{Store: cfg.kind, Scope: cfg.id.Scope, Key: cfg.id.Key, Action: cfg.cmd}
	if cfg.kind != "redis" {
		rep.Table = st.pg.Table()
	}
	if cfg.kind != "postgres" {
		rep.Prefix = cfg.prefix
	}
	var code int
	switch cfg.cmd {
	case "inspect":
		code, err = inspect(ctx, st, cfg, &rep)
	case "evict":
		code, err = evict(ctx, st, cfg, &rep)
	}
	if err != nil {
		fmt.Fprintln(stderr, "idemkey:", explain(err, cfg))
		if errors.Is(err, store.ErrInvalid) {
			return exitUsage
		}
		return exitFailed
	}
	if cfg.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		rep.print(stdout)
	}
	return code
}

func parse(args []string, stderr io.Writer, getenv func(string) string) (config, error) {
	var cfg config
	if len(args) == 0 {
		return cfg, usagef("no command: want inspect or evict")
	}
	cfg.cmd = args[0]
	fs := flag.NewFlagSet("idemkey "+cfg.cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage+"\nFlags of "+cfg.cmd+":\n")
		fs.PrintDefaults()
	}
	switch cfg.cmd {
	case "inspect", "evict":
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stderr, usage+"\nRun 'idemkey inspect -h' or 'idemkey evict -h' for the flags.\n")
		return cfg, flag.ErrHelp
	default:
		return cfg, usagef("unknown command %q: want inspect or evict", cfg.cmd)
	}
	var key, header string
	fs.StringVar(&cfg.id.Scope, "scope", "", "the key's scope (principal or tenant; default empty, the global scope)")
	fs.StringVar(&key, "key", "", "the idempotency key, as stored (without Structured Field quotes)")
	fs.StringVar(&header, "header", "", "the Idempotency-Key header value as sent, parsed as the middleware does")
	fs.StringVar(&cfg.kind, "store", getenv("IDEM_STORE"), "postgres, redis or tiered (default: from DATABASE_URL and REDIS_URL)")
	fs.StringVar(&cfg.table, "table", or(getenv("IDEM_TABLE"), postgres.DefaultTable), "the Postgres store's table")
	fs.StringVar(&cfg.schema, "schema", "", "the Postgres store's schema (default: the search_path)")
	fs.StringVar(&cfg.prefix, "prefix", or(getenv("IDEM_REDIS_PREFIX"), redis.DefaultPrefix), "the Redis store's key prefix")
	fs.BoolVar(&cfg.json, "json", false, "print one JSON object instead of lines")
	fs.DurationVar(&cfg.timeout, "timeout", 10*time.Second, "give up after this long")
	if cfg.cmd == "evict" {
		fs.BoolVar(&cfg.force, "force", false, "evict an in-flight record even if its lease is live")
	}
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return cfg, err
	}
	scopeSet := false
	fs.Visit(func(f *flag.Flag) { scopeSet = scopeSet || f.Name == "scope" })
	if err := cfg.identify(pos, key, header, scopeSet); err != nil {
		return cfg, err
	}
	if cfg.id.Key == "" {
		return cfg, usagef("no key: give it as an argument, -key or -header")
	}
	if err := cfg.id.Validate(); err != nil {
		return cfg, usageError{err.Error()}
	}
	if cfg.timeout <= 0 {
		return cfg, usagef("-timeout must be positive")
	}

	cfg.dbURL, cfg.redis = getenv("DATABASE_URL"), getenv("REDIS_URL")
	if cfg.kind == "" {
		switch {
		case cfg.dbURL != "" && cfg.redis != "":
			cfg.kind = "tiered"
		case cfg.dbURL != "":
			cfg.kind = "postgres"
		case cfg.redis != "":
			cfg.kind = "redis"
		default:
			return cfg, usagef("no store: set DATABASE_URL (Postgres), REDIS_URL (Redis) or both (tiered)")
		}
	}
	switch cfg.kind {
	case "postgres", "redis", "tiered":
	default:
		return cfg, usagef("store %q: want postgres, redis or tiered (memory lives inside its process)", cfg.kind)
	}
	if cfg.kind != "redis" && cfg.dbURL == "" {
		return cfg, usagef("the %s store needs DATABASE_URL", cfg.kind)
	}
	if cfg.kind != "postgres" && cfg.redis == "" {
		return cfg, usagef("the %s store needs REDIS_URL", cfg.kind)
	}
	return cfg, nil
}

func or(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// stores are the opened backends; in is the one the command acts on.
type stores struct {
	in    store.Inspector
	pg    *postgres.Store
	cache *redis.Store // the Redis store, alone or as the tiered cache
	close func()
}

func open(ctx context.Context, cfg config) (*stores, error) {
	st := &stores{close: func() {}}
	if cfg.kind != "redis" {
		conn, err := pgx.Connect(ctx, cfg.dbURL)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		opts := []postgres.Option{postgres.WithTable(cfg.table)}
		if cfg.schema != "" {
			opts = append(opts, postgres.WithSchema(cfg.schema))
		}
		st.pg, err = postgres.New(conn, opts...)
		if err != nil {
			_ = conn.Close(ctx)
			return nil, err
		}
		st.in = st.pg
		st.close = func() { _ = conn.Close(context.Background()) }
	}
	if cfg.kind != "postgres" {
		o, err := goredis.ParseURL(cfg.redis)
		if err != nil {
			st.close()
			return nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		o.ContextTimeoutEnabled = true
		client := goredis.NewClient(o)
		if st.cache, err = redis.New(client, redis.WithPrefix(cfg.prefix)); err != nil {
			_ = client.Close()
			st.close()
			return nil, err
		}
		st.in = st.cache
		closePG := st.close
		st.close = func() { _ = client.Close(); closePG() }
	}
	if cfg.kind == "tiered" {
		ts, err := tiered.New(st.cache, st.pg, tiered.WithTimeout(cfg.timeout))
		if err != nil {
			st.close()
			return nil, fmt.Errorf("tiered store: %w", err)
		}
		st.in = ts
	}
	return st, nil
}

func inspect(ctx context.Context, st *stores, cfg config, rep *report) (int, error) {
	info, err := st.in.Inspect(ctx, cfg.id)
	if err != nil {
		return 0, err
	}
	rep.describe(info)
	if cfg.kind == "tiered" {
		// What the cache holds, for the operator chasing a replay: a copy the
		// backstop does not have is dropped by evict.
		c, err := st.cache.Inspect(ctx, cfg.id)
		if err != nil {
			rep.CacheError = err.Error()
		} else {
			rep.Cache = &record{}
			rep.Cache.describe(c)
		}
	}
	if info.State == store.StateAbsent {
		rep.Result = "not_found"
		return exitNotFound, nil
	}
	rep.Result = "found"
	return exitDone, nil
}

func evict(ctx context.Context, st *stores, cfg config, rep *report) (int, error) {
	policy := store.EvictSettled
	if cfg.force {
		policy = store.EvictAny
	}
	rep.Policy = policy.String()
	found, evicted, err := st.in.Evict(ctx, cfg.id, policy)
	if err != nil && !evicted {
		return 0, err
	}
	rep.describe(found)
	switch {
	case evicted && err != nil: // gone from Postgres, but Redis kept its copy
		rep.Result, rep.CacheError = "evicted", err.Error()
		return exitFailed, nil
	case evicted:
		rep.Result = "evicted"
		return exitDone, nil
	case found.State == store.StateAbsent:
		rep.Result = "not_found"
	default:
		rep.Result = "refused"
	}
	return exitNotFound, nil
}

// explain adds a hint to the errors operators meet first.
func explain(err error, cfg config) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Sprintf("%v (check -table/IDEM_TABLE and -schema: %q)", err, cfg.table)
	}
	return err.Error()
}

// record is one store's Info in the report.
type record struct {
	State       string    `json:"state"`
	Fingerprint string    `json:"fingerprint,omitempty"`
	CreatedAt   time.Time `json:"createdAt,omitzero"`
	CompletedAt time.Time `json:"completedAt,omitzero"`
	ExpiresAt   time.Time `json:"expiresAt,omitzero"`
	LeaseUntil  time.Time `json:"leaseUntil,omitzero"`
	LeaseLive   bool      `json:"leaseLive"`
	Status      int       `json:"status,omitempty"`
	BodyBytes   int       `json:"bodyBytes"`
	BodyOmitted bool      `json:"bodyOmitted"`
	StoreTime   time.Time `json:"storeTime"`
	info        store.Info
}

func (r *record) describe(info store.Info) {
	utc := func(t time.Time) time.Time {
		if t.IsZero() {
			return t
		}
		return t.UTC()
	}
	*r = record{
		State:       info.State.String(),
		CreatedAt:   utc(info.CreatedAt),
		CompletedAt: utc(info.CompletedAt),
		ExpiresAt:   utc(info.ExpiresAt),
		LeaseUntil:  utc(info.LeaseUntil),
		LeaseLive:   info.LeaseLive(),
		Status:      info.Status,
		BodyBytes:   info.BodyBytes,
		BodyOmitted: info.BodyOmitted,
		StoreTime:   utc(info.Now),
		info:        info,
	}
	if info.State != store.StateAbsent {
		r.Fingerprint = info.Fingerprint.String()
	}
}

// report is what the command prints.
type report struct {
	Action string `json:"action"`
	Store  string `json:"store"`
	Table  string `json:"table,omitempty"`
	Prefix string `json:"prefix,omitempty"`
	Scope  string `json:"scope"`
	Key    string `json:"key"`
	record
	Policy     string  `json:"policy,omitempty"`
	Result     string  `json:"result"`
	Cache      *record `json:"cache,omitempty"`
	CacheError string  `json:"cacheError,omitempty"`
}

func (r *report) print(w io.Writer) {
	var b strings.Builder
	where := r.Store
	if r.Table != "" {
		where += " table " + r.Table
	}
	if r.Prefix != "" {
		where += fmt.Sprintf(" prefix %q", r.Prefix)
	}
	fmt.Fprintf(&b, "store        %s\nscope        %q\nkey          %q\n", where, r.Scope, r.Key)
	r.record.lines(&b, "")
	if r.Cache != nil {
		fmt.Fprintf(&b, "cache (redis)\n")
		r.Cache.lines(&b, "  ")
	}
	switch r.Result {
	case "evicted":
		fmt.Fprintf(&b, "evicted      the %s record is gone: the next request with this key runs the handler\n",
			strings.ReplaceAll(r.State, "_", "-"))
	case "refused":
		fmt.Fprintf(&b, "refused      the lease is live for another %v: a request may be running the handler (-force evicts it anyway)\n",
			r.info.LeaseRemaining().Round(time.Millisecond))
	case "not_found":
		if r.Action == "evict" {
			fmt.Fprintf(&b, "nothing to evict\n")
		}
	}
	if r.CacheError != "" {
		fmt.Fprintf(&b, "cache error  %s\n", r.CacheError)
	}
	_, _ = io.WriteString(w, b.String())
}

func (r *record) lines(b *strings.Builder, indent string) {
	line := func(name, format string, args ...any) {
		fmt.Fprintf(b, "%s%-12s %s\n", indent, name, fmt.Sprintf(format, args...))
	}
	const layout = "2006-01-02T15:04:05.000000Z07:00"
	info := r.info
	rel := func(t time.Time) string {
		d := t.Sub(info.Now).Round(time.Millisecond)
		if d > 0 {
			return "in " + d.String()
		}
		return (-d).String() + " ago"
	}
	if info.State == store.StateAbsent {
		if indent != "" { // the cache's copy
			line("state", "absent")
		} else {
			line("state", "absent (no record, or past its retention: the next request runs the handler)")
		}
		return
	}
	line("state", "%s", r.State)
	line("fingerprint", "%s", r.Fingerprint)
	line("created", "%s", r.CreatedAt.Format(layout))
	if info.State == store.StateInFlight {
		live := "expired, the holder stopped renewing"
		if info.LeaseLive() {
			live = "live"
		}
		line("lease until", "%s (%s, %s)", r.LeaseUntil.Format(layout), rel(info.LeaseUntil), live)
	} else {
		line("completed", "%s", r.CompletedAt.Format(layout))
	}
	if !info.ExpiresAt.IsZero() {
		line("expires", "%s (%s)", r.ExpiresAt.Format(layout), rel(info.ExpiresAt))
	}
	if info.State == store.StateCompleted {
		line("status", "%d", r.Status)
		if r.BodyOmitted {
			line("body", "omitted (over the storage cap)")
		} else {
			line("body", "%d bytes", r.BodyBytes)
		}
	}
}
