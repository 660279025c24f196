// Command endtoend compares, in one interleaved run over HTTP on loopback, bare
// net/http, idemkey's middleware on each store (memory, Redis, Postgres, tiered:
// Redis in front of Postgres), and Fiber v2 bare and behind its idempotency
// middleware on its memory storage and on its Redis storage
// (gofiber/storage/redis/v3), and idemkey on Fiber v2 (middleware/fiber) on
// memory and on Redis, the like-for-like row, all on the same private Redis:
//
//	go run ./endtoend -rounds 4 -d 3s -c 32 -body 128 -pg "$DATABASE_URL"
//
// Every (subject, mode) runs in a fresh server process (this program started
// again with -serve); a client in this process sends requests over -c
// keep-alive connections for -d after a warm-up of a tenth of it: first (a new
// key every request) and replay (one key completed before the run). Per run it
// prints requests/s, the server's CPU per request and Redis's main-thread CPU
// per request (INFO cpu) under that load (-profile DIR: and each server's CPU
// and allocation profiles, DIR/SUBJECT-MODE-ROUND.cpu and .allocs); then it sends -seq requests one at a
// time and prints Redis's main-thread CPU per request and, per command, calls
// per request and usec_per_call (INFO commandstats) for them: one at a time, no
// subject gains from the batching that concurrent clients give Redis. The floor
// a request's Redis cost is compared with is measured alike and interleaved
// with it: every server also serves the bare handler behind a plain GET of the
// record idemkey's Redis store keeps for the answer (/floor/get, the floor of a
// replay) or that GET and a SET of it (/floor/getset, of a first execution),
// and the sequential phase alternates batches of 100 requests of the subject
// and of its floor. Each round also ends with -seq plain GETs and SETs of that
// record in a loop from this process (the cheapest Redis can do; HTTP pacing
// alone costs Redis more per command).
// Then, from the medians of the rounds' ratios, the figures
// docs/architecture.md's performance section quotes.
//
// The Redis server is private: started on a free port (redis-server must be on
// PATH) unless -redis names one, never a shared one (the run resets its
// statistics). Without -pg the Postgres and tiered subjects are left out. On a
// shared machine compare ratios within a run, and trust Redis's own counters
// (exact per command) over wall times.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/benchmarks/internal/httpload"
	"github.com/idemkey/idemkey/store"
)

// subjects in the order a round runs them; bare ones run once, the others in
// both modes.
var subjects = []string{"bare", "fiber-bare", "memory", "fiber-memory", "idemkey-fiber-memory", "redis", "fiber-redis",
	"idemkey-fiber-redis", "postgres", "tiered"}

func main() {
	sub := flag.String("serve", "", "internal: serve this subject on 127.0.0.1 until stdin closes")
	var cfg serveConfig
	flag.StringVar(&cfg.redisAddr, "redis", "", "a private Redis (host:port); default: start redis-server on a free port")
	flag.StringVar(&cfg.pgURL, "pg", "", "Postgres URL for the postgres and tiered subjects (left out when empty)")
	flag.StringVar(&cfg.schema, "schema", "", "internal: the Postgres schema")
	flag.StringVar(&cfg.prefix, "prefix", "", "internal: the Redis key prefix")
	flag.StringVar(&cfg.floorKey, "floor", "", "internal: the key of the floor's value")
	flag.StringVar(&cfg.profile, "cpuprofile", "", "internal: the server's profiles, this path + .cpu and .allocs")
	profDir := flag.String("profile", "", "write each server's CPU and allocation profiles into this directory")
	rounds := flag.Int("rounds", 4, "rounds")
	d := flag.Duration("d", 0, "measured time of each run (default 3s)")
	c := flag.Int("c", 32, "client connections")
	size := flag.Int("body", 128, "request body size in bytes (at least 80)")
	seq := flag.Int("seq", 3000, "requests of each run's sequential phase, and plain commands of each kind")
	only := flag.String("only", "", "comma-separated subjects to run (default all)")
	flag.Parse()
	if *sub != "" {
		serve(*sub, cfg)
		return
	}
	if *d == 0 {
		*d = 3e9
	}
	if cfg.redisAddr == "" {
		addr, stop, err := startRedis()
		if err != nil {
			log.Fatal(err)
		}
		defer stop()
		cfg.redisAddr = addr
	}
	rc := goredis.NewClient(&goredis.Options{Addr: cfg.redisAddr})
	defer rc.Close()
	if err := rc.ConfigResetStat(context.Background()).Err(); err != nil {
		log.Fatal(err)
	}
	if cfg.pgURL != "" {
		cfg.schema = "idemkey_endtoend_" + store.NewToken().String()[:12]
		defer dropSchema(cfg.pgURL, cfg.schema)
	}
	var runList []string
	for _, s := range subjects {
		if (s == "postgres" || s == "tiered") && cfg.pgURL == "" {
			continue
		}
		if *only != "" && !slices.Contains(strings.Split(*only, ","), s) {
			continue
		}
		runList = append(runList, s)
	}
	b := bench{cfg: cfg, rc: rc, body: httpload.JSONBody(max(*size, 80)), c: *c, d: *d, seq: max(*seq, 1), profDir: *profDir}
	fmt.Printf("endtoend: %d rounds of %v per run, %d connections, %d-byte body, Redis %s\n",
		*rounds, *d, *c, len(b.body), cfg.redisAddr)
	if err := b.setFloor(); err != nil {
		log.Fatal(err)
	}
	var all []roundResult
	for r := range *rounds {
		all = append(all, b.round(r+1, runList))
	}
	summarize(all)
}

func dropSchema(url, schema string) {
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		return
	}
	defer pool.Close()
	_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
}
