package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/storetest"
)

func TestConformance(t *testing.T) {
	pool := newPool(t, "")
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: newStore(t, pool, nil)}
	})
}

// TestConformanceReadFirst runs the contract suite with WithReadFirst, whose
// Claim answers from a read of the key's row when no write is needed.
func TestConformanceReadFirst(t *testing.T) {
	pool := newPool(t, "")
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: newStore(t, pool, nil, WithReadFirst())}
	})
}

func TestNewRejectsBadConfig(t *testing.T) {
	var db Querier = (*pgxpool.Pool)(nil)
	for _, tc := range []struct {
		name string
		db   Querier
		opts []Option
	}{
		{"nil querier", nil, nil},
		{"empty table", db, []Option{WithTable("")}},
		{"long table", db, []Option{WithTable(strings.Repeat("t", 49))}},
		{"NUL in table", db, []Option{WithTable("a\x00b")}},
		{"NUL in schema", db, []Option{WithSchema("a\x00b")}},
		{"long schema", db, []Option{WithSchema(strings.Repeat("s", 64))}},
		{"zero batch", db, []Option{WithSweepBatch(0)}},
		{"negative body cap", db, []Option{WithMaxBody(-1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.db, tc.opts...); !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("New: %v, want ErrInvalid", err)
			}
		})
	}
}

func TestMigrationSQLQuotesNames(t *testing.T) {
	s, err := New((*pgxpool.Pool)(nil), WithSchema(`app"s`), WithTable(`keys; DROP TABLE x`))
	if err != nil {
		t.Fatal(err)
	}
	sql := s.MigrationSQL()
	for _, want := range []string{
		`CREATE SCHEMA IF NOT EXISTS "app""s";`,
		`CREATE TABLE IF NOT EXISTS "app""s"."keys; DROP TABLE x" (`,
		`CREATE INDEX IF NOT EXISTS "keys; DROP TABLE x_expires_at_idx" ON "app""s"."keys; DROP TABLE x" (expires_at);`,
	} {
		if !strings.Contains(sql, want) {
			t.Errorf("MigrationSQL lacks %s\n%s", want, sql)
		}
	}
	if strings.Contains(sql, "{{") {
		t.Errorf("unrendered placeholder in\n%s", sql)
	}
}

// TestMigrateIdempotent runs Migrate concurrently and repeatedly on a table whose
// name needs quoting, then uses the store.
func TestMigrateIdempotent(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	s := newStore(t, pool, nil, WithTable(`we"ird name; --`))
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- s.Migrate(ctx) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	var n, v int
	if err := pool.QueryRow(ctx, `SELECT count(*), max(version) FROM `+s.ident(s.table+"_migrations")).Scan(&n, &v); err != nil {
		t.Fatal(err)
	}
	if n != SchemaVersion || v != SchemaVersion {
		t.Fatalf("migrations table holds %d rows up to version %d, want %[3]d rows up to %[3]d", n, v, SchemaVersion)
	}
	var idx bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_indexes WHERE schemaname = $1 AND indexname = $2)`,
		s.schema, s.table+"_expires_at_idx").Scan(&idx); err != nil || !idx {
		t.Fatalf("expiry index missing (%v)", err)
	}
	id := newID()
	res, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Second, Retention: time.Minute})
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Claim on the quoted table: %+v, %v", res, err)
	}

	// A records table dropped behind Migrate's back is created again.
	if _, err := pool.Exec(ctx, `DROP TABLE `+s.Table()); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after the table was dropped: %v", err)
	}
	if res, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Second, Retention: time.Minute}); err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Claim on the re-created table: %+v, %v", res, err)
	}
}

// TestMigrateWithoutBegin runs the migration through a Querier that cannot open
// transactions (statement by statement).
func TestMigrateWithoutBegin(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, struct{ Querier }{pool})
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate without Begin: %v", err)
	}
}

// TestBinaryIDs checks that scope and key are kept as exact bytes: NUL, invalid
// UTF-8 and prefixes of each other stay distinct keys.
func TestBinaryIDs(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	ctx := t.Context()
	ids := []store.ID{
		{Scope: "", Key: "k"},
		{Scope: "\x00", Key: "k"},
		{Scope: "a\x00", Key: "k"},
		{Scope: "a", Key: "\x00k"},
		{Scope: "a", Key: "k\x00"},
		{Scope: "a", Key: "\xff\xfe"},
		{Scope: "a", Key: "k"},
	}
	for i, id := range ids {
		r := store.ClaimRequest{ID: id, Fingerprint: fingerprint(fmt.Sprint(i)), Lease: time.Minute, Retention: time.Hour}
		res, err := s.Claim(ctx, r)
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("Claim(%q): %+v, %v; want claimed (a distinct key)", id, res, err)
		}
		if err := s.Complete(ctx, id, res.Token, store.Response{Status: 200, Body: []byte(id.Scope + "|" + id.Key)}, time.Hour); err != nil {
			t.Fatalf("Complete(%q): %v", id, err)
		}
	}
	for i, id := range ids {
		r := store.ClaimRequest{ID: id, Fingerprint: fingerprint(fmt.Sprint(i)), Lease: time.Minute, Retention: time.Hour}
		res, err := s.Claim(ctx, r)
		if err != nil || res.Outcome != store.Completed || string(res.Record.Body) != id.Scope+"|"+id.Key {
			t.Fatalf("replay of %q: %+v, %v", id, res, err)
		}
	}
	long := store.ID{Scope: strings.Repeat("s", store.MaxScopeLen+1), Key: strings.Repeat("k", store.MaxKeyLen)}
	if _, err := s.Claim(ctx, store.ClaimRequest{ID: long, Fingerprint: fingerprint("x"), Lease: time.Second, Retention: time.Second}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("Claim of an ID over the core limits: %v, want ErrInvalid", err)
	}
}

// TestCorruptRows writes rows no correct store writes and checks that Claim
// answers ErrCorrupt (503 in the middleware) instead of panicking or replaying.
func TestCorruptRows(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	s := newStore(t, pool, nil, WithMaxBody(16))
	for _, tc := range []struct {
		name string
		set  string
	}{
		{"headers in an unknown format", `headers = '\x02'::bytea`},
		{"truncated headers", `headers = '\x010105'::bytea`},
		{"status out of range", `status = 42`},
		{"body next to the omitted mark", `body = 'x'::bytea, body_omitted = true`},
		{"body over the cap", `body = convert_to(repeat('x', 17), 'UTF8')`},
		{"completed without completion time", `completed_at = NULL`},
		{"in flight without lease", `status = NULL, lease_until = NULL`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := newID()
			r := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
			res, err := s.Claim(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, id, res.Token, store.Response{Status: 200, Header: http.Header{"A": {"b"}}}, time.Hour); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `UPDATE `+s.Table()+` SET `+tc.set+` WHERE scope = $1 AND key = $2`, []byte(id.Scope), []byte(id.Key)); err != nil {
				t.Fatal(err)
			}
			res, err = s.Claim(ctx, r)
			if !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("Claim of a corrupt row: %+v, %v; want ErrCorrupt", res, err)
			}
		})
	}
	if err := s.Complete(ctx, newID(), store.NewToken(), store.Response{Status: 200, Body: make([]byte, 17)}, time.Hour); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("Complete over the body cap: %v, want ErrInvalid", err)
	}
}

// TestClaimHazardDeterministic reproduces the READ COMMITTED hazard of docs/architecture.md
// section 4 step by step: another transaction inserts the key but has not
// committed; Claim's statement takes its snapshot and waits on the row lock; the
// transaction commits. The INSERT then sees the conflict but the statement's read
// cannot see the row, so the statement returns no row. Claim must re-run it and
// answer InFlight, not fail and not claim.
func TestClaimHazardDeterministic(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	s := newStore(t, pool, nil)
	id := newID()
	fp := fingerprint("a")

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.Table()+` (scope, key, fingerprint, token, lease_until, created_at, expires_at)
		VALUES ($1, $2, $3, $4, now() + interval '1 minute', now(), now() + interval '1 hour')`,
		[]byte(id.Scope), []byte(id.Key), fp[:], make([]byte, 16)); err != nil {
		t.Fatal(err)
	}

	type answer struct {
		res store.ClaimResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour})
		done <- answer{res, err}
	}()
	// Wait until the claim is blocked on the uncommitted row (its snapshot is taken).
	waitBlockedBy(t, pool, pid)
	before := s.Stats().ClaimRetries
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil {
		t.Fatalf("Claim: %v; want a definite answer", a.err)
	}
	if a.res.Outcome != store.InFlight || a.res.RetryAfter <= 0 {
		t.Fatalf("Claim: %+v; want in flight with the holder's remaining lease", a.res)
	}
	if got := s.Stats().ClaimRetries - before; got != 1 {
		t.Fatalf("the statement was re-run %d times; want 1 (the hazard was not hit?)", got)
	}
}

// TestClaimHazardStorm races many claimers on each of many fresh keys: exactly one
// claims each key, every other one gets InFlight, and none gets an error or no
// answer, however often the hazard is hit.
func TestClaimHazardStorm(t *testing.T) {
	pool := newPool(t, "", func(c *pgxpool.Config) { c.MaxConns = 16 })
	ctx := t.Context()
	s := newStore(t, pool, nil)
	const keys, claimers = 60, 16
	for range keys {
		id := newID()
		r := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			counts   = map[store.Outcome]int{}
			barrier  = make(chan struct{})
			firstErr error
		)
		for range claimers {
			wg.Go(func() {
				<-barrier
				res, err := s.Claim(ctx, r)
				mu.Lock()
				defer mu.Unlock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				counts[res.Outcome]++
			})
		}
		close(barrier)
		wg.Wait()
		if firstErr != nil {
			t.Fatalf("key %s: a claim failed: %v", id.Key, firstErr)
		}
		if counts[store.Claimed] != 1 || counts[store.InFlight] != claimers-1 {
			t.Fatalf("key %s: outcomes %v; want 1 claimed, %d in flight", id.Key, counts, claimers-1)
		}
	}
	retries := s.Stats().ClaimRetries
	t.Logf("claim statements re-run after the READ COMMITTED hazard: %d of %d claims", retries, keys*claimers)
	if retries == 0 {
		t.Error("the storm never hit the hazard; the test no longer provokes what it guards")
	}
}

// TestRetentionReplacesRecord checks that Claim treats a record past its retention
// as absent before any sweep: a completed record is replaced by a new claim with
// another payload, and created_at restarts.
func TestRetentionReplacesRecord(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	s := newStore(t, pool, nil)
	id := newID()
	const retention = time.Hour // ended below on the server's clock, not waited for
	r := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: retention}
	res, err := s.Claim(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, id, res.Token, store.Response{Status: 201}, retention); err != nil {
		t.Fatal(err)
	}
	first, err := s.Claim(ctx, r)
	if err != nil || first.Outcome != store.Completed {
		t.Fatalf("replay: %+v, %v", first, err)
	}
	// The retention ends: the record's deadline moves into the server's past.
	if _, err := pool.Exec(ctx, `UPDATE `+s.Table()+` SET expires_at = now() - interval '1 second' WHERE scope = $1 AND key = $2`,
		[]byte(id.Scope), []byte(id.Key)); err != nil {
		t.Fatal(err)
	}
	r.Fingerprint = fingerprint("b")
	res, err = s.Claim(ctx, r)
	if err != nil || res.Outcome != store.Claimed || res.Takeover {
		t.Fatalf("claim after retention: %+v, %v; want a fresh claim", res, err)
	}
	if err := s.Complete(ctx, id, res.Token, store.Response{Status: 202}, time.Hour); err != nil {
		t.Fatal(err)
	}
	again, err := s.Claim(ctx, r)
	if err != nil || again.Outcome != store.Completed || again.Record.Status != 202 {
		t.Fatalf("replay of the new record: %+v, %v", again, err)
	}
	if !again.Record.CreatedAt.After(first.Record.CreatedAt) {
		t.Errorf("created_at %v not after the replaced record's %v", again.Record.CreatedAt, first.Record.CreatedAt)
	}
}

// TestTakeoverKeepsCreatedAt: a takeover is the same request running once more.
func TestTakeoverKeepsCreatedAt(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	s := newStore(t, pool, nil)
	id := newID()
	r := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: 30 * time.Millisecond, Retention: time.Hour}
	if _, err := s.Claim(ctx, r); err != nil {
		t.Fatal(err)
	}
	var created time.Time
	if err := pool.QueryRow(ctx, `SELECT created_at FROM `+s.Table()+` WHERE key = $1`, []byte(id.Key)).Scan(&created); err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond) // the server's clock must pass the lease
	res, err := s.Claim(ctx, r)
	if err != nil || res.Outcome != store.Claimed || !res.Takeover {
		t.Fatalf("takeover: %+v, %v", res, err)
	}
	if err := s.Complete(ctx, id, res.Token, store.Response{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Claim(ctx, r)
	if err != nil || rep.Outcome != store.Completed || !rep.Record.CreatedAt.Equal(created) {
		t.Fatalf("replay after takeover: %+v, %v; want created_at %v", rep, err, created)
	}
}

// TestFailuresAreStoreErrors: cancellation, a statement timeout, an exhausted pool
// and a closed pool all surface as errors that are neither ErrLeaseLost nor a
// claim answer (the middleware answers 503), and none of them wedges the key past
// its lease.
func TestFailuresAreStoreErrors(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	s := newStore(t, pool, nil)
	lease := 200 * time.Millisecond

	// blockKey holds an uncommitted insert of id, so a claim of id waits on it.
	blockKey := func(t *testing.T, id store.ID) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback(context.Background()) })
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.Table()+` (scope, key, fingerprint, token, lease_until, created_at, expires_at)
			VALUES ($1, $2, $3, $4, now(), now(), now() + interval '1 hour')`,
			[]byte(id.Scope), []byte(id.Key), make([]byte, 32), make([]byte, 16)); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		name  string
		claim func(t *testing.T, r store.ClaimRequest) error
	}{
		{"cancelled before", func(t *testing.T, r store.ClaimRequest) error {
			c, cancel := context.WithCancel(ctx)
			cancel()
			_, err := s.Claim(c, r)
			return err
		}},
		{"deadline while blocked", func(t *testing.T, r store.ClaimRequest) error {
			blockKey(t, r.ID)
			c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_, err := s.Claim(c, r)
			return err
		}},
		{"statement timeout", func(t *testing.T, r store.ClaimRequest) error {
			slow := newPool(t, "", func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["statement_timeout"] = "100" })
			blockKey(t, r.ID)
			st, err := New(slow, WithSchema(s.schema))
			if err != nil {
				t.Fatal(err)
			}
			_, err = st.Claim(ctx, r)
			return err
		}},
		{"pool exhausted", func(t *testing.T, r store.ClaimRequest) error {
			one := newPool(t, "", func(c *pgxpool.Config) { c.MaxConns = 1 })
			conn, err := one.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			st, err := New(one, WithSchema(s.schema))
			if err != nil {
				t.Fatal(err)
			}
			c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_, err = st.Claim(c, r)
			return err
		}},
		{"pool closed", func(t *testing.T, r store.ClaimRequest) error {
			gone := newPool(t, "")
			gone.Close()
			st, err := New(gone, WithSchema(s.schema))
			if err != nil {
				t.Fatal(err)
			}
			_, err = st.Claim(ctx, r)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := newID()
			r := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: lease, Retention: time.Hour}
			t.Run("fails", func(t *testing.T) {
				err := tc.claim(t, r)
				if err == nil || errors.Is(err, store.ErrLeaseLost) || errors.Is(err, store.ErrInvalid) {
					t.Fatalf("Claim: %v; want a store error", err)
				}
			}) // the subtest's cleanups release the blocking transaction
			time.Sleep(lease + 50*time.Millisecond) // the server's clock must pass the lease
			res, err := s.Claim(ctx, r)
			if err != nil || res.Outcome != store.Claimed {
				t.Fatalf("claim after the lease: %+v, %v; want claimed (the key is not wedged)", res, err)
			}
		})
	}

	// The holder's calls fail the same way.
	c, cancel := context.WithCancel(ctx)
	cancel()
	id := newID()
	for name, err := range map[string]error{
		"Complete": s.Complete(c, id, store.NewToken(), store.Response{Status: 200}, time.Hour),
		"Release":  s.Release(c, id, store.NewToken()),
		"Renew":    s.Renew(c, id, store.NewToken(), time.Second),
	} {
		if !errors.Is(err, context.Canceled) || errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("%s with a cancelled context: %v; want context.Canceled", name, err)
		}
	}
}

// countingTracer counts the statements pgx sends (Query, QueryRow, Exec).
type countingTracer struct {
	mu sync.Mutex
	n  int
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *countingTracer) take() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = 0
	return n
}

// TestStatementsPerTransition counts the statements of each transition: one
// each (with WithReadFirst a new key's claim is two: TestClaimReadsFirst).
func TestStatementsPerTransition(t *testing.T) {
	tracer := &countingTracer{}
	admin := newPool(t, "")
	traced := newPool(t, "", func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	s := newStore(t, admin, traced)
	ctx := t.Context()
	id := newID()
	r := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}

	var tok store.Token
	steps := []struct {
		name string
		do   func() error
		want int
	}{
		{"claim", func() error {
			res, err := s.Claim(ctx, r)
			tok = res.Token
			return err
		}, 1},
		{"in-flight duplicate", func() error { _, err := s.Claim(ctx, r); return err }, 1},
		{"renew", func() error { return s.Renew(ctx, id, tok, time.Minute) }, 1},
		{"complete", func() error {
			return s.Complete(ctx, id, tok, store.Response{Status: 200, Header: http.Header{"A": {"b"}}, Body: []byte("x")}, time.Hour)
		}, 1},
		{"replay", func() error {
			res, err := s.Claim(ctx, r)
			if err == nil && res.Outcome != store.Completed {
				err = fmt.Errorf("outcome %v", res.Outcome)
			}
			return err
		}, 1},
		{"mismatch", func() error {
			_, err := s.Claim(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("b"), Lease: time.Minute, Retention: time.Hour})
			return err
		}, 1},
		{"release of a new claim", func() error {
			id2 := newID()
			res, err := s.Claim(ctx, store.ClaimRequest{ID: id2, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour})
			if err != nil {
				return err
			}
			tracer.take()
			return s.Release(ctx, id2, res.Token)
		}, 1},
	}
	tracer.take()
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if n := tracer.take(); n != st.want {
			t.Errorf("%s sent %d statements, want %d", st.name, n, st.want)
		}
	}
}

func TestSweep(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	s := newStore(t, pool, nil, WithSweepBatch(2))
	short := store.ClaimRequest{Fingerprint: fingerprint("a"), Lease: 10 * time.Millisecond, Retention: 20 * time.Millisecond}
	for range 5 {
		short.ID = newID()
		if _, err := s.Claim(ctx, short); err != nil {
			t.Fatal(err)
		}
	}
	live := newID()
	if _, err := s.Claim(ctx, store.ClaimRequest{ID: live, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the server's clock must pass the retention
	count := func() (n int) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+s.Table()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n, err := s.Sweep(ctx, 3); err != nil || n != 3 {
		t.Fatalf("Sweep(3) = %d, %v; want 3", n, err)
	}
	if n, err := s.Sweep(ctx, 0); err != nil || n != 2 {
		t.Fatalf("Sweep(0) = %d, %v; want the 2 left", n, err)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d rows left, want the live one", n)
	}

	// The background sweeper deletes what expires and stops when asked.
	short.ID = newID()
	if _, err := s.Claim(ctx, short); err != nil {
		t.Fatal(err)
	}
	stop := s.StartSweeper(ctx, 20*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for count() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not delete the expired record")
		}
		time.Sleep(10 * time.Millisecond) // waiting on the server's clock and the sweeper's ticker
	}
	stop()
}

// TestRefusedClaimsDoNotWrite: a replay, an in-flight duplicate and a mismatch are
// answered by a plain read. Had the claim reached INSERT ... ON CONFLICT DO
// UPDATE, Postgres would have locked the row (setting its xmax, writing WAL and
// flushing a commit) even though the update's WHERE refused it.
func TestRefusedClaimsDoNotWrite(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	s := newStore(t, pool, nil)
	done, held := newID(), newID()
	r := func(id store.ID, fp string) store.ClaimRequest {
		return store.ClaimRequest{ID: id, Fingerprint: fingerprint(fp), Lease: time.Minute, Retention: time.Hour}
	}
	res, err := s.Claim(ctx, r(done, "a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, done, res.Token, store.Response{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, r(held, "a")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		req  store.ClaimRequest
		want store.Outcome
	}{
		{r(done, "a"), store.Completed},
		{r(done, "b"), store.Mismatch},
		{r(held, "a"), store.InFlight},
		{r(held, "b"), store.Mismatch},
	} {
		res, err := s.Claim(ctx, tc.req)
		if err != nil || res.Outcome != tc.want {
			t.Fatalf("Claim: %+v, %v; want %v", res, err, tc.want)
		}
	}
	var locked int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+s.Table()+` WHERE xmax::text <> '0'`).Scan(&locked); err != nil {
		t.Fatal(err)
	}
	if locked != 0 {
		t.Fatalf("%d rows were locked by refused claims", locked)
	}
}
