package tiered_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/tiered"
)

// postgresBackstop returns a migrated Postgres store in a schema of its own,
// dropped at cleanup. ok is false (after t.Skip unless required) without DATABASE_URL.
func postgresBackstop(t testing.TB, pool *pgxpool.Pool, opts ...postgres.Option) *postgres.Store {
	t.Helper()
	schema := "idemkey_tiered_" + store.NewToken().String()[:12]
	s, err := postgres.New(pool, append([]postgres.Option{postgres.WithSchema(schema)}, opts...)...)
	if err != nil {
		t.Fatalf("postgres.New: %v", err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(s.StopWaiters) // before the schema is dropped
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return s
}

// mustTiered builds a tiered store or fails the test.
func mustTiered(t testing.TB, fast tiered.Cache, back store.Store, opts ...tiered.Option) *tiered.Store {
	t.Helper()
	s, err := tiered.New(fast, back, opts...)
	if err != nil {
		t.Fatalf("tiered.New: %v", err)
	}
	return s
}

// pgPool connects to DATABASE_URL; skips without it (fails when CI=true).
func pgPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := testenv.Getenv(t, "DATABASE_URL", "a Postgres server")
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("DATABASE_URL: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// anyBackstop is Postgres when DATABASE_URL is set, else the memory store: the fault
// tests are about Redis and run either way.
func anyBackstop(t testing.TB) store.Store {
	t.Helper()
	if os.Getenv("DATABASE_URL") == "" && !testenv.CI() {
		t.Log("DATABASE_URL not set: memory store as the backstop")
		return memory.New()
	}
	return postgresBackstop(t, pgPool(t))
}

// testTimeout replaces the 50 ms default Redis timeout in tests that are not about
// timeouts: on a loaded CI machine a healthy Redis can take longer, and a fast-path
// timeout there would only be a spurious fallback.
const testTimeout = time.Second

var errDown = errors.New("backstop down (injected)")

// probe wraps a backstop: counts its calls and can be switched down.
type probe struct {
	store.Store
	calls atomic.Int64
	down  atomic.Bool
}

func (p *probe) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	p.calls.Add(1)
	if p.down.Load() {
		return store.ClaimResult{}, errDown
	}
	return p.Store.Claim(ctx, req)
}

func (p *probe) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	p.calls.Add(1)
	if p.down.Load() {
		return errDown
	}
	return p.Store.Complete(ctx, id, tok, resp, ret)
}

func (p *probe) Release(ctx context.Context, id store.ID, tok store.Token) error {
	p.calls.Add(1)
	if p.down.Load() {
		return errDown
	}
	return p.Store.Release(ctx, id, tok)
}

func (p *probe) Renew(ctx context.Context, id store.ID, tok store.Token, lease time.Duration) error {
	p.calls.Add(1)
	if p.down.Load() {
		return errDown
	}
	return p.Store.Renew(ctx, id, tok, lease)
}

// faultClient is a client for a private server that fails fast when it is down.
func faultClient(t testing.TB, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		DialTimeout:           50 * time.Millisecond,
		MaxRetries:            -1,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func fingerprint(s string) store.Fingerprint {
	var f store.Fingerprint
	copy(f[:], s)
	return f
}

// app simulates the middleware in front of a handler: claim, run once, complete;
// replay when completed; wait and retry when in flight.
type app struct {
	s       store.Store
	lease   time.Duration
	runs    map[string]*atomic.Int64 // executions per key, preallocated
	replays atomic.Int64
}

func newApp(s store.Store, lease time.Duration, keys []string) *app {
	a := &app{s: s, lease: lease, runs: make(map[string]*atomic.Int64, len(keys))}
	for _, k := range keys {
		a.runs[k] = new(atomic.Int64)
	}
	return a
}

// do performs one request for key until it is executed or replayed; it returns the
// first store error (the middleware's 503).
func (a *app) do(ctx context.Context, key string) error {
	id := store.ID{Scope: "tenant", Key: key}
	req := store.ClaimRequest{ID: id, Fingerprint: fingerprint(key), Lease: a.lease, Retention: time.Minute}
	for {
		res, err := a.s.Claim(ctx, req)
		if err != nil {
			return err
		}
		switch res.Outcome {
		case store.Claimed:
			a.runs[key].Add(1)
			return a.s.Complete(ctx, id, res.Token, store.Response{Status: 201, Body: []byte("done:" + key)}, time.Minute)
		case store.Completed:
			if got := string(res.Record.Body); got != "done:"+key {
				return fmt.Errorf("%w: replay of %s carries %q", errWrong, key, got)
			}
			a.replays.Add(1)
			return nil
		case store.InFlight:
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(max(res.RetryAfter/4, time.Millisecond)):
			}
		default:
			return fmt.Errorf("%w: %s answered %v", errWrong, key, res.Outcome)
		}
	}
}

var errWrong = errors.New("wrong answer")

// quietLogger drops go-redis's connection-pool logs, which the fault tests provoke
// on purpose.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	goredis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

// mustRedis builds a Redis store or fails the test.
func mustRedis(t testing.TB, c goredis.UniversalClient, opts ...redis.Option) *redis.Store {
	t.Helper()
	s, err := redis.New(c, opts...)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	return s
}
