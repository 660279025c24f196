// Package apptest holds the HTTP tests both account servers (examples/nethttp and
// examples/echo) run, so the two stay equal to docs/architecture.md section 6 without copied
// test files: each server's test calls Run with its Mount.
package apptest

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	awsdynamodb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	_ "github.com/go-sql-driver/mysql" // the "mysql" driver of DropMySQLTables
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/examples/accounts"
	"github.com/idemkey/idemkey/examples/accounts/httpapi"
	"github.com/idemkey/idemkey/examples/internal/accountsapp"
	"github.com/idemkey/idemkey/examples/internal/setup"
	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store/dynamodb/dynamotest"
)

// Server is a server started in-process by Start.
type Server struct {
	URL string
	App *accountsapp.App
	// Sim is the in-process Celeriant simulator (CELERIANT_ADDR empty), for fault
	// injection.
	Sim *celeriantsim.Sim
	// Stop shuts the server down gracefully and waits for Serve to return; it is
	// also run at cleanup.
	Stop func()
}

// Start parses env (ADDR forced to 127.0.0.1:0) with setup.Load, opens its
// connections, builds the server with wire, serves it with accountsapp.Serve and
// returns once the server printed its listening line. At cleanup it stops the
// server, fails the test if Serve did not return nil, and closes the App and the
// connections.
func Start(t testing.TB, wire accountsapp.Wire, env map[string]string) *Server {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return StartLogged(t, wire, env, logger)
}

// StartLogged is Start with the server's logger.
func StartLogged(t testing.TB, wire accountsapp.Wire, env map[string]string, logger *slog.Logger) *Server {
	t.Helper()
	env["ADDR"] = "127.0.0.1:0"
	getenv := func(k string) string { return env[k] }
	cfg, err := setup.Load(getenv)
	if err != nil {
		t.Fatal(err)
	}
	conns, err := setup.Connect(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	app, h, err := wire(context.Background(), cfg, conns, logger)
	if err != nil {
		conns.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- accountsapp.Serve(ctx, cfg, h, pw, logger)
		pw.Close()
	}()
	stopped := false
	s := &Server{App: app}
	s.Sim, _ = app.Events.(*celeriantsim.Sim)
	s.Stop = func() {
		if stopped {
			return
		}
		stopped = true
		// The live-update streams end with the feed (in a server, with the
		// context given to Open): end them so they do not hold up the drain.
		if app.Feed != nil {
			app.Feed.Close()
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server stopped with %v", err)
		}
		app.Close()
		conns.Close()
	}
	t.Cleanup(s.Stop)
	line, err := bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	if err != nil {
		t.Fatalf("server printed no listening line: %v", err)
	}
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	if !ok || !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("unexpected first line %q", line)
	}
	s.URL = url
	return s
}

// RandomSuffix returns 8 random hex characters for table names and key prefixes.
func RandomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Backend is one store the API table runs on: the server's environment, and
// Drop, which removes the tables or keys that server creates. The subtest that
// starts the server registers Drop, so a subtest that a -run filter leaves out
// drops nothing it never created.
type Backend struct {
	Env  map[string]string
	Drop func(t *testing.T)
}

// Backends returns the stores the API table runs on: always memory; with
// DATABASE_URL a Postgres store and projection on fresh tables; with REDIS_URL a
// Redis store under a fresh prefix; with MYSQL_DSN or DYNAMODB_ENDPOINT those
// stores on a fresh table; with both DATABASE_URL and REDIS_URL, the tiered store
// on a fresh table and prefix. Without those variables the backends are left out
// with a message, unless CI=true, where a missing server fails the test.
func Backends(t *testing.T) map[string]Backend {
	t.Helper()
	out := map[string]Backend{"memory": {Env: map[string]string{}, Drop: func(*testing.T) {}}}
	ci := testenv.CI()
	if url := os.Getenv("DATABASE_URL"); url != "" {
		sfx := RandomSuffix()
		table, prefix := "idem_app_"+sfx, "app_"+sfx+"_"
		out["postgres"] = Backend{map[string]string{"IDEM_STORE": "postgres", "DATABASE_URL": url, "IDEM_TABLE": table,
			"PROJECTION": "postgres", "ACCOUNTS_TABLE_PREFIX": prefix}, func(t *testing.T) { DropTables(t, url, table, prefix) }}
	} else if ci {
		t.Error("CI=true but DATABASE_URL is not set")
	} else {
		t.Log("DATABASE_URL not set: skipping the Postgres backend")
	}
	if url := os.Getenv("REDIS_URL"); url != "" {
		prefix := "idemapp:" + RandomSuffix() + ":"
		out["redis"] = Backend{map[string]string{"IDEM_STORE": "redis", "REDIS_URL": url, "IDEM_REDIS_PREFIX": prefix},
			func(t *testing.T) { DeleteRedisPrefix(t, url, prefix) }}
	} else if ci {
		t.Error("CI=true but REDIS_URL is not set")
	} else {
		t.Log("REDIS_URL not set: skipping the Redis backend")
	}
	if dsn := os.Getenv("MYSQL_DSN"); dsn != "" {
		table := "idem_app_" + RandomSuffix()
		out["mysql"] = Backend{map[string]string{"IDEM_STORE": "mysql", "MYSQL_DSN": dsn, "IDEM_TABLE": table},
			func(t *testing.T) { DropMySQLTables(t, dsn, table) }}
	} else if ci {
		t.Error("CI=true but MYSQL_DSN is not set")
	} else {
		t.Log("MYSQL_DSN not set: skipping the MySQL backend")
	}
	if ep := os.Getenv("DYNAMODB_ENDPOINT"); ep != "" {
		table := "idem_app_" + RandomSuffix()
		out["dynamodb"] = Backend{map[string]string{"IDEM_STORE": "dynamodb", "DYNAMODB_ENDPOINT": ep, "IDEM_TABLE": table},
			func(t *testing.T) { deleteDynamoTable(t, table) }}
	} else if ci {
		t.Error("CI=true but DYNAMODB_ENDPOINT is not set")
	} else {
		t.Log("DYNAMODB_ENDPOINT not set: skipping the DynamoDB backend")
	}
	if db, rd := os.Getenv("DATABASE_URL"), os.Getenv("REDIS_URL"); db != "" && rd != "" {
		sfx := RandomSuffix()
		table, prefix := "idem_tiered_"+sfx, "idemtiered:"+sfx+":"
		out["tiered"] = Backend{map[string]string{"IDEM_STORE": "tiered", "DATABASE_URL": db, "IDEM_TABLE": table,
			"REDIS_URL": rd, "IDEM_REDIS_PREFIX": prefix}, func(t *testing.T) { DropTables(t, db, table, table); DeleteRedisPrefix(t, rd, prefix) }}
	}
	return out
}

// DropTables drops every table whose name starts with storeTable (the store's
// table and its migrations ledger) or with prefix (the projection's).
func DropTables(t testing.TB, url, storeTable, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Errorf("dropping test tables: %v", err)
		return
	}
	defer pool.Close()
	var names []string
	rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = current_schema()
AND (starts_with(tablename, $1) OR starts_with(tablename, $2))`, storeTable, prefix)
	if err == nil {
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Errorf("listing test tables: %v", err)
	}
	for _, n := range names {
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{n}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("dropping %s: %v", n, err)
		}
	}
}

// DropMySQLTables drops the mysql store's table and its migrations ledger on
// the server of dsn.
func DropMySQLTables(t testing.TB, dsn, table string) {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Errorf("MYSQL_DSN: %v", err)
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+table+"`, `"+table+"_migrations`"); err != nil {
		t.Errorf("dropping %s: %v", table, err)
	}
}

// DeleteRedisPrefix deletes every key starting with prefix.
func DeleteRedisPrefix(t testing.TB, url, prefix string) {
	t.Helper()
	o, err := goredis.ParseURL(url)
	if err != nil {
		t.Errorf("REDIS_URL: %v", err)
		return
	}
	c := goredis.NewClient(o)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Errorf("deleting test keys: %v", err)
	}
}

// Response is an answer read whole.
type Response struct {
	Status int
	Header http.Header
	Body   string
}

var client = &http.Client{Timeout: 30 * time.Second}

// Do sends one request; key and clientID set Idempotency-Key and X-Client-ID when
// not empty.
func Do(t testing.TB, method, url, key, clientID, body string) Response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if clientID != "" {
		req.Header.Set("X-Client-ID", clientID)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, url, err)
	}
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
}

// EventCount returns how many events of the log of acct carry eventID, read from
// Celeriant itself.
func EventCount(t testing.TB, es celeriant.EventStore, acct, eventID uuid.UUID) int {
	t.Helper()
	batches, err := celeriant.ReadAll(context.Background(), es, celeriant.ReadRequest{
		Key: accounts.Key(acct), Filters: celeriant.ReadFilters{FromVersion: 1}})
	if err != nil && !celeriant.IsNotFound(err) {
		t.Fatalf("reading the log of %s: %v", acct, err)
	}
	n := 0
	for _, b := range batches {
		for _, e := range b.Events {
			if e.EventID == eventID {
				n++
			}
		}
	}
	return n
}

// problemCode returns the code member of a problem answer, failing the test when
// the answer is not application/problem+json.
func problemCode(t testing.TB, r Response) (code string, members map[string]any) {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json (body %s)", ct, r.Body)
	}
	if err := json.Unmarshal([]byte(r.Body), &members); err != nil {
		t.Errorf("problem body %q: %v", r.Body, err)
	}
	code, _ = members["code"].(string)
	// The middleware's problems are the library's (type urn:idemkey:problem:<code>);
	// the account API's own are in the API's namespace. Both carry error (the
	// code in upper case, as the reference spells it; the middleware's through
	// middleware.ProblemRule.Members) and message (the detail), and code is lower
	// snake_case and ends the type. The API's are reported by their error, the
	// middleware's by their code.
	typ, _ := members["type"].(string)
	upper, _ := members["error"].(string)
	if code != strings.ToLower(code) || upper != strings.ToUpper(code) || members["message"] != members["detail"] {
		t.Errorf("problem code %q, error %q, message %q, detail %q: want code lower case, error = upper(code), message = detail",
			code, upper, members["message"], members["detail"])
	}
	switch typ {
	case "urn:idemkey:problem:" + code:
	case httpapi.ProblemTypePrefix + code:
		code = upper
	default:
		t.Errorf("problem type %q, want urn:idemkey:problem:%s or %s%s", typ, code, httpapi.ProblemTypePrefix, code)
	}
	if st, _ := members["status"].(float64); int(st) != r.Status {
		t.Errorf("problem status member %v, answer %d", members["status"], r.Status)
	}
	return code, members
}

// deleteDynamoTable deletes the dynamodb store's table on DYNAMODB_ENDPOINT.
func deleteDynamoTable(t *testing.T, table string) {
	t.Helper()
	c := dynamotest.Client(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.DeleteTable(ctx, &awsdynamodb.DeleteTableInput{TableName: &table}); err != nil {
		t.Errorf("deleting %s: %v", table, err)
	}
}
