package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/tiered"
)

// The tests run the command as its own process: the test binary re-executed
// with runMainEnv set runs main() with the arguments after "--".
const runMainEnv = "IDEMKEY_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"idemkey"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		return
	}
	os.Exit(m.Run())
}

type result struct {
	code           int
	stdout, stderr string
}

// idemkey runs the command with env (KEY=value) as its whole environment
// besides PATH and HOME, so the developer's own DATABASE_URL or REDIS_URL never
// leak in.
func idemkey(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	// GORACE: a -race binary otherwise sleeps 1 s before exiting with status 0.
	cmd.Env = append([]string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"GORACE=atexit_sleep_ms=0"}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("idemkey %q: %v", args, err)
	}
	return result{code, stdout.String(), stderr.String()}
}

func (r result) want(t *testing.T, code int, stdout ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	for _, s := range stdout {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("stdout lacks %q:\n%s", s, r.stdout)
		}
	}
}

func mustEnv(t *testing.T, name string) string {
	t.Helper()
	return testenv.Getenv(t, name, "its server")
}

// backend is one store configuration: the environment the command gets and the
// same store opened in the test, to set records up and check the effects.
type backend struct {
	name  string
	env   []string
	flags []string // put after the command
	store interface {
		store.Store
		store.Inspector
	}
}

func postgresBackend(t *testing.T) (pg *postgres.Store, env, flags []string) {
	t.Helper()
	url := mustEnv(t, "DATABASE_URL")
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema := "idemkey_cli_" + store.NewToken().String()[:12]
	table := "records_" + store.NewToken().String()[:8]
	pg, err = postgres.New(pool, postgres.WithSchema(schema), postgres.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	return pg, []string{"DATABASE_URL=" + url, "IDEM_TABLE=" + table}, []string{"-schema", schema}
}

func backends(t *testing.T) []backend {
	pg, pgEnv, pgFlags := postgresBackend(t)
	c := redistest.Shared(t)
	prefix := redistest.Prefix(t, c)
	rs, err := redis.New(c, redis.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	redisEnv := []string{"REDIS_URL=" + mustEnv(t, "REDIS_URL"), "IDEM_REDIS_PREFIX=" + prefix}

	tpg, tpgEnv, tpgFlags := postgresBackend(t)
	tprefix := redistest.Prefix(t, c)
	fast, err := redis.New(c, redis.WithPrefix(tprefix))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := tiered.New(fast, tpg)
	if err != nil {
		t.Fatal(err)
	}
	return []backend{
		{"postgres", pgEnv, pgFlags, pg},
		{"redis", redisEnv, nil, rs},
		{"tiered", append(tpgEnv, "REDIS_URL="+mustEnv(t, "REDIS_URL"), "IDEM_REDIS_PREFIX="+tprefix), tpgFlags, ts},
	}
}

func TestInspectAndEvict(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := t.Context()
			run := func(args ...string) result {
				return idemkey(t, b.env, append(append([]string{args[0]}, b.flags...), args[1:]...)...)
			}
			claim := func(key string, lease time.Duration) store.Token {
				t.Helper()
				res, err := b.store.Claim(ctx, store.ClaimRequest{ID: store.ID{Scope: "alice", Key: key},
					Fingerprint: store.Fingerprint{7}, Lease: lease, Retention: time.Hour})
				if err != nil || res.Outcome != store.Claimed {
					t.Fatalf("Claim(%s): %v %v", key, res.Outcome, err)
				}
				return res.Token
			}
			state := func(key string) store.State {
				t.Helper()
				info, err := b.store.Inspect(ctx, store.ID{Scope: "alice", Key: key})
				if err != nil {
					t.Fatal(err)
				}
				return info.State
			}
			done := store.ID{Scope: "alice", Key: "order-1"}
			if err := b.store.Complete(ctx, done, claim(done.Key, time.Minute), store.Response{Status: 201, Body: []byte(`{"id":1}`)}, time.Hour); err != nil {
				t.Fatal(err)
			}
			claim("busy", time.Minute)
			claim("stale", time.Millisecond)
			// Wait for the store's clock, which the test cannot move, to pass the 1 ms lease.
			for i := 0; ; i++ {
				info, err := b.store.Inspect(ctx, store.ID{Scope: "alice", Key: "stale"})
				if err != nil || !info.LeaseLive() {
					break
				}
				if i > 1000 {
					t.Fatal("the 1 ms lease never expired")
				}
				time.Sleep(time.Millisecond)
			}

			r := run("inspect", "alice", "order-1")
			r.want(t, 0, "state        completed\n", "status       201\n", "body         8 bytes\n", `scope        "alice"`,
				"fingerprint  07000000")
			if b.name == "tiered" && !strings.Contains(r.stdout, "cache (redis)\n  state        completed\n") {
				t.Errorf("tiered inspect does not show the Redis copy:\n%s", r.stdout)
			}

			var rep map[string]any
			r = run("inspect", "-json", "-scope", "alice", "-header", `"order-1"`)
			r.want(t, 0)
			if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
				t.Fatalf("-json output: %v\n%s", err, r.stdout)
			}
			if rep["state"] != "completed" || rep["status"] != 201.0 || rep["result"] != "found" || rep["store"] != b.name ||
				rep["key"] != "order-1" || rep["completedAt"] == nil || rep["leaseUntil"] != nil {
				t.Errorf("-json report %v", rep)
			}

			// The scope as an argument whatever gives the key, and flags after the
			// arguments, as the usage line reads.
			for _, args := range [][]string{
				{"inspect", "-header", `"order-1"`, "alice"},
				{"inspect", "-key", "order-1", "alice"},
				{"inspect", "alice", "order-1", "-timeout", "5s"},
				{"inspect", "alice", "-timeout", "5s", "order-1"},
				{"inspect", "-key", "order-1", "alice", "-timeout", "5s"},
				{"inspect", "--", "alice", "order-1"},
			} {
				run(args...).want(t, 0, "state        completed\n", `scope        "alice"`)
			}
			run("inspect", "-key", "order-1", "bob").want(t, 1, "state        absent")

			run("inspect", "alice", "missing").want(t, 1, "state        absent")
			run("inspect", "bob", "order-1").want(t, 1, "state        absent") // scopes are apart

			// A live lease is refused, and kept; -force evicts it.
			run("inspect", "alice", "busy").want(t, 0, "state        in_flight\n", ", live)")
			run("evict", "alice", "busy").want(t, 1, "refused      the lease is live for another ")
			if s := state("busy"); s != store.StateInFlight {
				t.Fatalf("refused evict left %v", s)
			}
			run("evict", "-force", "alice", "busy").want(t, 0, "evicted      the in-flight record is gone")
			if s := state("busy"); s != store.StateAbsent {
				t.Fatalf("forced evict left %v", s)
			}

			run("inspect", "alice", "stale").want(t, 0, "expired, the holder stopped renewing")
			run("evict", "alice", "stale").want(t, 0, "evicted")

			r = run("evict", "-json", "alice", "order-1")
			r.want(t, 0)
			rep = nil
			if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || rep["result"] != "evicted" || rep["state"] != "completed" ||
				rep["policy"] != "completed|lease_expired" {
				t.Errorf("-json evict report %v (%v)", rep, err)
			}
			run("evict", "alice", "order-1").want(t, 1, "nothing to evict")
			// The key is new: a claim runs the handler again.
			res, err := b.store.Claim(ctx, store.ClaimRequest{ID: done, Fingerprint: store.Fingerprint{8}, Lease: time.Minute, Retention: time.Hour})
			if err != nil || res.Outcome != store.Claimed || res.Takeover {
				t.Fatalf("Claim after evict: %+v %v", res, err)
			}
		})
	}
}

func TestUsage(t *testing.T) {
	pgOnly := []string{"DATABASE_URL=postgres://127.0.0.1:1/none"}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		code int
		err  string
	}{
		{"no command", pgOnly, nil, 2, "no command"},
		{"unknown command", pgOnly, []string{"drop", "k"}, 2, "unknown command"},
		{"help", nil, []string{"-h"}, 0, "usage: idemkey inspect"},
		{"command help", nil, []string{"evict", "-h"}, 0, "-force"},
		{"unknown flag", pgOnly, []string{"inspect", "-nope", "k"}, 2, "-nope"},
		{"force on inspect", pgOnly, []string{"inspect", "-force", "k"}, 2, "-force"},
		{"no key", pgOnly, []string{"inspect", "alice", ""}, 2, "no key"},
		{"no key at all", pgOnly, []string{"evict"}, 2, "no key"},
		{"key twice", pgOnly, []string{"inspect", "-key", "k", "s", "k"}, 2, "twice"},
		{"key thrice", pgOnly, []string{"inspect", "-key", "k", "-header", "k", "s"}, 2, "twice"},
		{"scope twice", pgOnly, []string{"inspect", "-scope", "a", "b", "k"}, 2, "twice"},
		{"scope twice, key as a flag", pgOnly, []string{"inspect", "-scope", "a", "-key", "k", "b"}, 2, "twice"},
		{"scope twice, flags last", pgOnly, []string{"inspect", "b", "k", "-scope", "a"}, 2, "twice"},
		{"too many", pgOnly, []string{"inspect", "a", "b", "c"}, 2, "too many"},
		{"bad header", pgOnly, []string{"inspect", "-header", `"unterminated`}, 2, "-header"},
		{"no store", nil, []string{"inspect", "k"}, 2, "no store"},
		{"memory", []string{"IDEM_STORE=memory"}, []string{"inspect", "k"}, 2, "memory"},
		{"tiered without redis", pgOnly, []string{"inspect", "-store", "tiered", "k"}, 2, "REDIS_URL"},
		{"key too long", pgOnly, []string{"inspect", strings.Repeat("k", 256)}, 2, "invalid"},
		{"scope too long", pgOnly, []string{"evict", strings.Repeat("s", 1025), "k"}, 2, "invalid"},
		{"store down", pgOnly, []string{"inspect", "-timeout", "5s", "k"}, 3, "postgres"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := idemkey(t, tc.env, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.err) {
				t.Errorf("exit %d, stderr %q; want %d with %q", r.code, r.stderr, tc.code, tc.err)
			}
			if tc.code != 0 && r.stdout != "" {
				t.Errorf("stdout %q on failure", r.stdout)
			}
		})
	}
}

func TestMissingTable(t *testing.T) {
	url := mustEnv(t, "DATABASE_URL")
	r := idemkey(t, []string{"DATABASE_URL=" + url, "IDEM_TABLE=no_such_table_" + store.NewToken().String()[:8]}, "inspect", "k")
	if r.code != 3 || !strings.Contains(r.stderr, "check -table/IDEM_TABLE") {
		t.Errorf("exit %d, stderr %q; want 3 with a hint", r.code, r.stderr)
	}
}

// TestTieredRedisDown: with Redis unreachable a tiered evict still removes the
// Postgres record, says that the Redis copy may remain, and exits 3; inspect
// answers from Postgres and reports the cache's error.
func TestTieredRedisDown(t *testing.T) {
	pg, env, flags := postgresBackend(t)
	ctx := t.Context()
	id := store.ID{Scope: "alice", Key: "order-1"}
	res, err := pg.Claim(ctx, store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Complete(ctx, id, res.Token, store.Response{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	env = append(env, "REDIS_URL=redis://127.0.0.1:1/0")
	run := func(args ...string) result {
		return idemkey(t, env, append(append([]string{args[0]}, flags...), args[1:]...)...)
	}
	run("inspect", "-timeout", "5s", "alice", "order-1").want(t, 0, "state        completed\n", "cache error  ")
	run("evict", "-timeout", "5s", "alice", "order-1").want(t, 3, "evicted      the completed record is gone", "cache error  ")
	if info, err := pg.Inspect(ctx, id); err != nil || info.State != store.StateAbsent {
		t.Fatalf("Postgres record after evict: %v %v", info.State, err)
	}
}
