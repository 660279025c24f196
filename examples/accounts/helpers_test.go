package accounts

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/internal/testclock"
	"github.com/idemkey/idemkey/internal/testenv"
)

// newFakeClock returns a settable clock shared by the simulator (server timestamps) and
// the memory projections (index lifetimes).
func newFakeClock() *testclock.Clock {
	return testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
}

// sleepRecorder replaces the backoff sleep: it records the durations and, with settle
// set (the simulator), waits until the simulator has no write in flight instead of
// sleeping them, or, with real set (a real server), sleeps them. Either way a catch-up
// after the backoff sees the write that caused a 2003: the server (and the simulator,
// with its default commit delay) answers 2003 as soon as the other write is queued and
// makes it readable only once fsynced (docs/celeriant-protocol.md section 6.5), and the
// service's backoff is longer than that window.
type sleepRecorder struct {
	real   bool
	settle func() <-chan struct{}
	mu     sync.Mutex
	sleeps []time.Duration
}

func (r *sleepRecorder) Sleep(ctx context.Context, d time.Duration) error {
	r.mu.Lock()
	r.sleeps = append(r.sleeps, d)
	r.mu.Unlock()
	var done <-chan struct{}
	switch {
	case r.settle != nil:
		done = r.settle()
	case r.real:
		c := make(chan struct{})
		t := time.AfterFunc(d, func() { close(c) })
		defer t.Stop()
		done = c
	default:
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *sleepRecorder) Sleeps() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.sleeps...)
}

// hookStore wraps an event store and runs hooks around writes and reads, so tests can
// place another replica's write exactly between a catch-up and a write.
type hookStore struct {
	celeriant.EventStore
	mu          sync.Mutex
	writes      int
	beforeWrite func(n int) // n counts this store's writes from 1
	afterWrite  func(n int, err error)
	read        func(req celeriant.ReadRequest) (celeriant.ReadResult, error, bool)
}

func (h *hookStore) Write(ctx context.Context, req celeriant.WriteRequest) (celeriant.WriteResult, error) {
	h.mu.Lock()
	h.writes++
	n, before, after := h.writes, h.beforeWrite, h.afterWrite
	h.mu.Unlock()
	if before != nil {
		before(n)
	}
	res, err := h.EventStore.Write(ctx, req)
	if after != nil {
		after(n, err)
	}
	return res, err
}

func (h *hookStore) Read(ctx context.Context, req celeriant.ReadRequest) (celeriant.ReadResult, error) {
	h.mu.Lock()
	read := h.read
	h.mu.Unlock()
	if read != nil {
		if res, err, ok := read(req); ok {
			return res, err
		}
	}
	return h.EventStore.Read(ctx, req)
}

// pgPool returns a pool on DATABASE_URL, skipping (or failing under CI=true) when unset.
func pgPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := testenv.Getenv(t, "DATABASE_URL", "a Postgres server")
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func randomPrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "acct_t" + hex.EncodeToString(b[:]) + "_"
}

// newPGProjections returns a factory of Postgres projections sharing fresh tables.
func newPGProjections(t testing.TB) func(t testing.TB, clock *testclock.Clock, window time.Duration) Projection {
	t.Helper()
	pool := pgPool(t)
	prefix := randomPrefix()
	first, err := NewPostgresProjection(pool, WithTablePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(func() {
		b, r, m := first.Tables()
		_, err := pool.Exec(context.Background(), fmt.Sprintf("DROP TABLE IF EXISTS %s, %s, %s", b, r, m))
		if err != nil {
			t.Errorf("dropping test tables: %v", err)
		}
	})
	return func(t testing.TB, _ *testclock.Clock, window time.Duration) Projection {
		p, err := NewPostgresProjection(pool, WithTablePrefix(prefix), WithPostgresWindow(window))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// forEachKind runs f once per projection backend.
func forEachKind(t *testing.T, f func(t *testing.T, mk func(t *testing.T, clock *testclock.Clock, window time.Duration) Projection)) {
	t.Run("memory", func(t *testing.T) {
		f(t, func(t *testing.T, clock *testclock.Clock, window time.Duration) Projection {
			return NewMemoryProjection(WithMemoryClock(clock.Now), WithMemoryWindow(window))
		})
	})
	t.Run("postgres", func(t *testing.T) {
		mk := newPGProjections(t)
		f(t, func(t *testing.T, c *testclock.Clock, w time.Duration) Projection { return mk(t, c, w) })
	})
}

// env is a test fixture: one log (simulated, or a real server's) and its clock.
type env struct {
	t     *testing.T
	clock *testclock.Clock
	sim   *celeriantsim.Sim    // nil on a real server
	log   celeriant.EventStore // sim, or the client of a real server
	run   string               // "" on the simulator; a per-run suffix for names on a real server
	mk    func(t *testing.T, clock *testclock.Clock, window time.Duration) Projection
	// precision is the log's timestamp precision, given to every pod.
	precision celeriant.Precision
}

func newEnv(t *testing.T, mk func(t *testing.T, clock *testclock.Clock, window time.Duration) Projection) *env {
	return newEnvAt(t, mk, celeriant.Milliseconds)
}

// newEnvAt is newEnv on a simulator stamping batches in precision p.
func newEnvAt(t *testing.T, mk func(t *testing.T, clock *testclock.Clock, window time.Duration) Projection, p celeriant.Precision) *env {
	clock := newFakeClock()
	sim := celeriantsim.New(celeriantsim.Options{Now: clock.Now, PageBatches: 3, Precision: p})
	t.Cleanup(func() { _ = sim.Close() })
	return &env{t: t, clock: clock, sim: sim, log: sim, mk: mk, precision: p}
}

// newLogEnv is newEnv on the real Celeriant server at CELERIANT_ADDR when it is set
// (then the clock starts at the real time, which the server stamps batches with, and
// names get a per-run suffix, since the server keeps what earlier runs wrote), else on
// the simulator. Only tests that need no fault injection use it.
func newLogEnv(t *testing.T, mk func(t *testing.T, clock *testclock.Clock, window time.Duration) Projection) *env {
	addr := os.Getenv("CELERIANT_ADDR")
	if addr == "" {
		return newEnv(t, mk)
	}
	c, err := celeriant.New(celeriant.Config{Addrs: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &env{t: t, clock: testclock.New(time.Now()), log: c, run: "-" + randomPrefix(), mk: mk}
}

// name returns s with the run's suffix: a fresh name on a real server.
func (e *env) name(s string) string { return s + e.run }

// pod is one replica: a service with its own projection (shared state for Postgres).
type pod struct {
	*Service
	proj   Projection
	store  *hookStore
	sleeps *sleepRecorder
}

func (e *env) pod(window time.Duration, opts ...Option) *pod {
	e.t.Helper()
	return e.podOn(e.log, window, opts...)
}

// podOn is pod with its own connection to the log (a replica's client).
func (e *env) podOn(log celeriant.EventStore, window time.Duration, opts ...Option) *pod {
	e.t.Helper()
	p := &pod{proj: e.mk(e.t, e.clock, window), store: &hookStore{EventStore: log}, sleeps: e.sleeper()}
	all := append([]Option{WithSleep(p.sleeps.Sleep), WithLogger(slog.New(slog.DiscardHandler)), WithTimestampPrecision(e.precision)}, opts...)
	svc, err := New(p.store, p.proj, all...)
	if err != nil {
		e.t.Fatal(err)
	}
	p.Service = svc
	return p
}

// sleeper returns the backoff recorder for this log (see sleepRecorder).
func (e *env) sleeper() *sleepRecorder {
	if e.sim == nil {
		return &sleepRecorder{real: true}
	}
	return &sleepRecorder{settle: e.sim.Settled}
}

// events returns every event of acct's stream, read from the log itself.
func (e *env) events(acct uuid.UUID) []celeriant.Event {
	e.t.Helper()
	batches, err := celeriant.ReadAll(context.Background(), e.log, celeriant.ReadRequest{Key: Key(acct), Filters: celeriant.ReadFilters{FromVersion: 1}})
	if minAvail, ok := celeriant.IsUnavailableVersion(err); ok { // trimmed: what is left
		batches, err = celeriant.ReadAll(context.Background(), e.log, celeriant.ReadRequest{Key: Key(acct), Filters: celeriant.ReadFilters{FromVersion: minAvail}})
	}
	if celeriant.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatalf("reading the log of %s: %v", acct, err)
	}
	var out []celeriant.Event
	for _, b := range batches {
		out = append(out, b.Events...)
	}
	return out
}

// countID counts the events of acct carrying eventID.
func (e *env) countID(acct, eventID uuid.UUID) int {
	n := 0
	for _, ev := range e.events(acct) {
		if ev.EventID == eventID {
			n++
		}
	}
	return n
}

// foreignWrite appends an event of another client id (an Unknown type, which folds as
// zero) to acct, unconditionally.
func (e *env) foreignWrite(acct uuid.UUID) {
	e.t.Helper()
	_, err := e.log.Write(context.Background(), celeriant.WriteRequest{
		ClientID: uuid.MustParse("0badc0de-0000-4000-8000-000000000001"),
		Writes: []celeriant.AggregateWrite{{Key: Key(acct), AllowCreate: true,
			Events: []celeriant.Event{{ClientSeq: 1, TypeMajor: 99, Value: []byte("{}")}}}},
	})
	if err != nil {
		e.t.Fatalf("foreign write: %v", err)
	}
}

func acctID(name string) uuid.UUID { return uuid.NewSHA1(ReferenceNamespace, []byte(name)) }

func eid(label string, n int) uuid.UUID {
	return uuid.NewSHA1(ReferenceNamespace, []byte(fmt.Sprintf("%s-req-%d", label, n)))
}
