package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	idem2 "github.com/gofiber/fiber/v2/middleware/idempotency"
	fiberredis "github.com/gofiber/storage/redis/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/cputime"
	"github.com/idemkey/idemkey/middleware"
	idemfiber "github.com/idemkey/idemkey/middleware/fiber"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/tiered"
)

// answer is the handler's response body, the same for every subject.
var answer = []byte(`{"balanceCents":98766,"aggregateVersion":42}`)

// serveConfig is what a server process needs besides its subject.
type serveConfig struct {
	redisAddr, pgURL, schema, prefix string
	floorKey                         string // holds the value the floor endpoints read
	profile                          string // internal: write CPU and allocation profiles to profile+".cpu", ".allocs"
}

// serve runs subject on a free loopback port, prints its address, and exits
// when stdin closes. GET /cpu answers the process's CPU time (ns).
func serve(subject string, cfg serveConfig) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer startProfile(cfg.profile)()
	if strings.Contains(subject, "fiber-") {
		serveFiber(subject, cfg, ln)
		return
	}
	handler := http.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(answer)
	}))
	bare := handler
	if subject != "bare" {
		handler = newMiddleware(subject, cfg).Handler(handler)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /api/transfers", handler)
	fl := newFloor(cfg)
	mux.Handle("POST /floor/get", fl.handler(false, bare))
	mux.Handle("POST /floor/getset", fl.handler(true, bare))
	mux.HandleFunc("GET /cpu", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, int64(cputime.Used())) })
	fmt.Printf("listening on http://%s\n", ln.Addr())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// floor is the Redis work a request cannot do with less, served beside the
// subject by the same process: a plain GET of the value under cfg.floorKey (the
// record idemkey's Redis store keeps for the run's answer), or that GET and a
// SET of it under a key of the request's. The sequential phase alternates
// batches of subject and floor requests, so both meet the same load.
type floor struct {
	c   *goredis.Client
	key string
}

func newFloor(cfg serveConfig) *floor {
	return &floor{c: goredis.NewClient(&goredis.Options{Addr: cfg.redisAddr, PoolSize: 64}), key: cfg.floorKey}
}

// do runs the floor's commands for a request with idempotency key k.
func (f *floor) do(ctx context.Context, set bool, k string) error {
	v, err := f.c.Get(ctx, f.key).Result()
	if err == nil && set {
		err = f.c.Set(ctx, f.key+":"+k, v, time.Hour).Err()
	}
	return err
}

func (f *floor) handler(set bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := f.do(r.Context(), set, r.Header.Get("Idempotency-Key")); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// newMiddleware is idemkey's middleware on the store of subject (memory,
// redis, postgres, tiered), configured alike for net/http and Fiber.
func newMiddleware(subject string, cfg serveConfig) *middleware.Middleware {
	m, err := middleware.New(idemStore(subject, cfg), middleware.ScopeFromHeader("X-Client-ID", "anonymous"),
		middleware.WithRecordRetention(policy.RetentionRule{Default: 24 * time.Hour}),
		middleware.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		log.Fatal(err)
	}
	return m
}

// startProfile starts a CPU profile into path+".cpu" (nothing when path is
// empty); the function it returns stops it and writes the allocations since
// the start into path+".allocs".
func startProfile(path string) func() {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path + ".cpu")
	if err != nil {
		log.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		log.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		a, err := os.Create(path + ".allocs")
		if err != nil {
			log.Fatal(err)
		}
		defer a.Close()
		_ = pprof.Lookup("allocs").WriteTo(a, 0)
	}
}

// idemStore builds the store of an idemkey subject.
func idemStore(subject string, cfg serveConfig) store.Store {
	ctx := context.Background()
	rc := func() *goredis.Client {
		return goredis.NewClient(&goredis.Options{Addr: cfg.redisAddr, PoolSize: 64, ContextTimeoutEnabled: true})
	}
	pg := func() *postgres.Store {
		pool, err := pgxpool.New(ctx, cfg.pgURL)
		if err != nil {
			log.Fatal(err)
		}
		s, err := postgres.New(pool, postgres.WithSchema(cfg.schema))
		if err != nil {
			log.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			log.Fatal(err)
		}
		return s
	}
	switch subject {
	case "memory":
		return memory.New(memory.WithMaxBytes(1 << 40)) // first keeps every key of a run
	case "redis":
		return mustRedis(rc(), cfg.prefix)
	case "postgres":
		return pg()
	case "tiered":
		s, err := tiered.New(mustRedis(rc(), cfg.prefix), pg())
		if err != nil {
			log.Fatal(err)
		}
		return s
	}
	log.Fatalf("unknown subject %q", subject)
	return nil
}

// serveFiber serves a Fiber v2 subject: bare, behind its idempotency
// middleware on its default in-memory storage or on its Redis storage
// (gofiber/storage/redis/v3) on the same Redis, or behind idemkey's Fiber
// adapter (middleware/fiber) on idemkey's memory or Redis store.
func serveFiber(subject string, cfg serveConfig, ln net.Listener) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	var chain []fiber.Handler // the middleware on the subject's route only
	switch subject {
	case "fiber-memory":
		chain = append(chain, idem2.New(idem2.Config{KeyHeader: "Idempotency-Key", Lifetime: 24 * time.Hour}))
	case "fiber-redis":
		st := fiberredis.New(fiberredis.Config{Addrs: []string{cfg.redisAddr}, PoolSize: 64})
		chain = append(chain, idem2.New(idem2.Config{KeyHeader: "Idempotency-Key", Lifetime: 24 * time.Hour, Storage: st}))
	case "idemkey-fiber-memory", "idemkey-fiber-redis":
		chain = append(chain, idemfiber.Middleware(newMiddleware(strings.TrimPrefix(subject, "idemkey-fiber-"), cfg)))
	case "fiber-bare":
	default:
		log.Fatalf("unknown subject %q", subject)
	}
	handler := func(c *fiber.Ctx) error {
		_ = c.Body()
		c.Set("Content-Type", "application/json")
		return c.Status(http.StatusCreated).Send(answer)
	}
	app.Post("/api/transfers", append(chain, handler)...)
	fl := newFloor(cfg)
	for path, set := range map[string]bool{"/floor/get": false, "/floor/getset": true} {
		app.Post(path, func(c *fiber.Ctx) error {
			if err := fl.do(c.UserContext(), set, c.Get("Idempotency-Key")); err != nil {
				return c.Status(http.StatusServiceUnavailable).SendString(err.Error())
			}
			return handler(c)
		})
	}
	app.Get("/cpu", func(c *fiber.Ctx) error { return c.SendString(fmt.Sprintln(int64(cputime.Used()))) })
	fmt.Printf("listening on http://%s\n", ln.Addr())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = app.Shutdown()
	}()
	if err := app.Listener(ln); err != nil {
		log.Fatal(err)
	}
}

// mustRedis is the Redis store on c with prefix; a bad prefix ends the program.
func mustRedis(c goredis.UniversalClient, prefix string) *redis.Store {
	s, err := redis.New(c, redis.WithPrefix(prefix))
	if err != nil {
		log.Fatal(err)
	}
	return s
}
