package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/postgres/inbox"
)

// pool connects to DATABASE_URL (a failure when CI=true and it is unset, a skip
// otherwise) and closes the pool when the test ends.
func pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	u := testenv.Getenv(t, "DATABASE_URL", "a Postgres server")
	p, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// newInbox returns a migrated inbox in a schema of its own, dropped at the end.
func newInbox(t *testing.T, p *pgxpool.Pool, opts ...inbox.Option) (*inbox.Inbox, string) {
	t.Helper()
	schema := "idemkey_inbox_test_" + store.NewToken().String()[:12]
	in, err := inbox.New(p, append([]inbox.Option{inbox.WithSchema(schema)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if _, err := p.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	if err := in.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return in, schema
}

func begin(t *testing.T, p *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := p.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func record(t *testing.T, in *inbox.Inbox, q pgx.Tx, consumer, id string, want inbox.Outcome) {
	t.Helper()
	got, err := in.Record(t.Context(), q, consumer, id)
	if err != nil || got != want {
		t.Fatalf("Record(%q, %q) = %v, %v; want %v", consumer, id, got, err, want)
	}
}

// usable fails unless tx still runs statements (a duplicate must not abort it).
func usable(t *testing.T, tx pgx.Tx) {
	t.Helper()
	var one int
	if err := tx.QueryRow(t.Context(), "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("transaction unusable after a duplicate: %v", err)
	}
}

func count(t *testing.T, p *pgxpool.Pool, in *inbox.Inbox) int {
	t.Helper()
	var n int
	if err := p.QueryRow(t.Context(), "SELECT count(*) FROM "+in.Table()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRecordNewThenDuplicate(t *testing.T) {
	p := pool(t)
	in, _ := newInbox(t, p)
	tx := begin(t, p)
	record(t, in, tx, "applier", "msg-1", inbox.Applied)
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	dup := begin(t, p)
	record(t, in, dup, "applier", "msg-1", inbox.AlreadyProcessed)
	usable(t, dup)
	record(t, in, dup, "auditor", "msg-1", inbox.Applied)     // consumers are independent
	record(t, in, dup, "applier", "msg-1\x00", inbox.Applied) // any bytes, compared exactly
	if err := dup.Commit(t.Context()); err != nil {
		t.Fatalf("commit after a duplicate: %v", err)
	}
	if n := count(t, p, in); n != 3 {
		t.Fatalf("%d rows, want 3", n)
	}
}

// TestConcurrentDuplicateWaits: a second delivery of a message whose first
// transaction is still open waits on the unique index, then sees the outcome
// of the first: a commit makes it a duplicate (its transaction still usable),
// a rollback lets it apply.
func TestConcurrentDuplicateWaits(t *testing.T) {
	p := pool(t)
	for _, tc := range []struct {
		name   string
		commit bool
		want   inbox.Outcome
	}{
		{"first commits", true, inbox.AlreadyProcessed},
		{"first rolls back", false, inbox.Applied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, _ := newInbox(t, p)
			first := begin(t, p)
			record(t, in, first, "applier", "msg-1", inbox.Applied)

			second := begin(t, p)
			var pid uint32
			if err := second.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			got := make(chan inbox.Outcome, 1)
			errc := make(chan error, 1)
			go func() {
				o, err := in.Record(t.Context(), second, "applier", "msg-1")
				got <- o
				errc <- err
			}()
			waitForLock(t, p, pid)
			select {
			case o := <-got:
				t.Fatalf("second delivery answered %v while the first was open", o)
			default:
			}
			if tc.commit {
				if err := first.Commit(t.Context()); err != nil {
					t.Fatal(err)
				}
			} else if err := first.Rollback(t.Context()); err != nil {
				t.Fatal(err)
			}
			if o, err := <-got, <-errc; err != nil || o != tc.want {
				t.Fatalf("second delivery = %v, %v; want %v", o, err, tc.want)
			}
			usable(t, second)
			if err := second.Commit(t.Context()); err != nil {
				t.Fatal(err)
			}
			if n := count(t, p, in); n != 1 {
				t.Fatalf("%d rows, want 1", n)
			}
		})
	}
}

// waitForLock polls until backend pid waits on a lock (the unique index entry of
// the open transaction), bounded at 10 s.
func waitForLock(t *testing.T, p *pgxpool.Pool, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		if err := p.QueryRow(t.Context(), "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the second delivery never waited on the first's lock")
		}
		time.Sleep(5 * time.Millisecond) // polling another backend's state; nothing to wait on
	}
}

func TestProcess(t *testing.T) {
	p := pool(t)
	in, schema := newInbox(t, p)
	ctx := t.Context()
	applied := pgx.Identifier{schema, "applied"}.Sanitize()
	if _, err := p.Exec(ctx, "CREATE TABLE "+applied+" (id text)"); err != nil {
		t.Fatal(err)
	}
	apply := func(id string, fail error) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+applied+" VALUES ($1)", id); err != nil {
				return err
			}
			return fail
		}
	}
	rows := func() int {
		var n int
		if err := p.QueryRow(ctx, "SELECT count(*) FROM "+applied).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	errHandler := errors.New("handler failed")
	if _, err := in.Process(ctx, "applier", "m1", apply("m1", errHandler)); !errors.Is(err, errHandler) {
		t.Fatalf("failing handler: %v, want its error", err)
	}
	if rows() != 0 || count(t, p, in) != 0 {
		t.Fatal("a failed handler left rows behind")
	}
	for i, want := range []inbox.Outcome{inbox.Applied, inbox.AlreadyProcessed, inbox.AlreadyProcessed} {
		called := false
		o, err := in.Process(ctx, "applier", "m1", func(ctx context.Context, tx pgx.Tx) error {
			called = true
			return apply("m1", nil)(ctx, tx)
		})
		if err != nil || o != want || called != (want == inbox.Applied) {
			t.Fatalf("delivery %d = %v, %v (handler called %v); want %v", i, o, err, called, want)
		}
	}
	if rows() != 1 || count(t, p, in) != 1 {
		t.Fatalf("%d applied rows, %d inbox rows; want 1 and 1", rows(), count(t, p, in))
	}
}

// A handler that panics leaves no transaction open: its connection goes back to
// the pool and the redelivery, which would otherwise wait on the first
// delivery's row lock forever, applies the message.
func TestProcessPanicRollsBack(t *testing.T) {
	p := pool(t)
	_, schema := newInbox(t, p)
	// A pool of its own, so that a transaction left open fails this test
	// instead of hanging the shared pool's Close: it is closed only when every
	// connection came back, and the leaked one is terminated otherwise.
	own, err := pgxpool.New(t.Context(), os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(own, inbox.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if own.Stat().AcquiredConns() == 0 {
			own.Close()
			return
		}
		p.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE state LIKE 'idle in transaction%' AND query LIKE '%' || $1 || '%'`, schema)
	})
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		in.Process(t.Context(), "applier", "m1", func(context.Context, pgx.Tx) error { panic("boom") })
	}()
	if n := own.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired after the panic, want 0", n)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	called := false
	o, err := in.Process(ctx, "applier", "m1", func(context.Context, pgx.Tx) error { called = true; return nil })
	if err != nil || o != inbox.Applied || !called {
		t.Fatalf("redelivery after a panic = %v, %v (handler called %v); want applied", o, err, called)
	}
}

func TestInsertRecognisesOnlyItsConstraint(t *testing.T) {
	p := pool(t)
	in, schema := newInbox(t, p)
	other, _ := newInbox(t, p, inbox.WithTable("other_inbox"))
	ctx := t.Context()
	if err := in.Insert(ctx, p, "applier", "m1"); err != nil {
		t.Fatalf("first insert: %v", err)
	}
	tx := begin(t, p)
	err := in.Insert(ctx, tx, "applier", "m1")
	if !errors.Is(err, inbox.ErrAlreadyProcessed) || !in.IsDuplicate(err) {
		t.Fatalf("duplicate insert: %v, want ErrAlreadyProcessed", err)
	}
	_ = tx.Rollback(ctx)

	// Another unique violation, in the caller's own table, is not a duplicate.
	mine := pgx.Identifier{schema, "mine"}.Sanitize()
	if _, err := p.Exec(ctx, "CREATE TABLE "+mine+" (id text CONSTRAINT mine_id_key UNIQUE)"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err = p.Exec(ctx, "INSERT INTO "+mine+" VALUES ('x')")
	}
	if err == nil || in.IsDuplicate(err) || !strings.Contains(err.Error(), "23505") {
		t.Fatalf("IsDuplicate(%v) = true or no unique violation; want false for another constraint", err)
	}
	// Nor is one of another inbox table.
	if err := other.Insert(ctx, p, "applier", "m1"); err != nil {
		t.Fatal(err)
	}
	err = other.Insert(ctx, p, "applier", "m1")
	if !other.IsDuplicate(err) || in.IsDuplicate(err) {
		t.Fatalf("other inbox's duplicate %v: recognised by the wrong inbox", err)
	}
	if in.IsDuplicate(nil) || in.IsDuplicate(errors.New("23505")) {
		t.Fatal("IsDuplicate true for an error that is not a unique violation")
	}
	if in.InsertSQL() == "" || in.Constraint() != "idemkey_inbox_pkey" {
		t.Fatalf("InsertSQL %q, Constraint %q", in.InsertSQL(), in.Constraint())
	}
}

func TestSweepRemovesOnlyExpired(t *testing.T) {
	p := pool(t)
	in, _ := newInbox(t, p, inbox.WithRetention(time.Hour), inbox.WithSweepBatch(2))
	ctx := t.Context()
	for i := range 8 {
		if _, err := in.Record(ctx, p, "applier", fmt.Sprint("m", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Five of them processed two hours ago (server clock), three just now.
	if _, err := p.Exec(ctx, "UPDATE "+in.Table()+" SET processed_at = now() - interval '2 hours' WHERE message_id IN ('m0','m1','m2','m3','m4')"); err != nil {
		t.Fatal(err)
	}
	if n, err := in.Sweep(ctx, 1); err != nil || n != 1 {
		t.Fatalf("Sweep(limit 1) = %d, %v; want 1", n, err)
	}
	if n, err := in.Sweep(ctx, 0); err != nil || n != 4 {
		t.Fatalf("Sweep = %d, %v; want the 4 other expired rows", n, err)
	}
	if n := count(t, p, in); n != 3 {
		t.Fatalf("%d rows left, want the 3 recent ones", n)
	}
	tx := begin(t, p)
	record(t, in, tx, "applier", "m0", inbox.Applied) // forgotten after its retention
	record(t, in, tx, "applier", "m7", inbox.AlreadyProcessed)
}

func TestMigrateIdempotentAndConcurrent(t *testing.T) {
	p := pool(t)
	in, schema := newInbox(t, p)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			twin, err := inbox.New(p, inbox.WithSchema(schema))
			if err == nil {
				err = twin.Migrate(t.Context())
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	if _, err := p.Exec(t.Context(), "DROP TABLE "+in.Table()); err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate after the table was dropped: %v", err)
	}
	if n := count(t, p, in); n != 0 {
		t.Fatalf("%d rows in a fresh table", n)
	}
	sql := in.MigrationSQL()
	for _, want := range []string{"CREATE SCHEMA IF NOT EXISTS", `"idemkey_inbox_pkey"`, `"idemkey_inbox_processed_at_idx"`, "ON " + in.Table()} {
		if !strings.Contains(sql, want) {
			t.Errorf("MigrationSQL lacks %q:\n%s", want, sql)
		}
	}
}

// The idempotency store and the inbox migrating into the same new schema at
// once serialise on one lock: neither sees the other's CREATE SCHEMA as a
// unique violation.
func TestMigrateBesideTheStore(t *testing.T) {
	p := pool(t)
	for round := range 5 {
		schema := fmt.Sprintf("idemkey_inbox_test_%s_%d", store.NewToken().String()[:8], round)
		t.Cleanup(func() {
			p.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		})
		var wg sync.WaitGroup
		errs := make(chan error, 6)
		for i := range 6 {
			wg.Go(func() {
				if i%2 == 0 {
					st, err := postgres.New(p, postgres.WithSchema(schema))
					if err == nil {
						err = st.Migrate(t.Context())
					}
					errs <- err
					return
				}
				in, err := inbox.New(p, inbox.WithSchema(schema))
				if err == nil {
					err = in.Migrate(t.Context())
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: Migrate beside the other: %v", round, err)
			}
		}
	}
}

func TestInvalidArguments(t *testing.T) {
	p := pool(t)
	in, _ := newInbox(t, p)
	tx := begin(t, p)
	long := strings.Repeat("x", inbox.MaxIDBytes)
	for _, tc := range []struct{ consumer, id string }{{"", "m"}, {"c", ""}, {"c", long}} {
		if _, err := in.Record(t.Context(), tx, tc.consumer, tc.id); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Record(%.10q, %.10q): %v, want store.ErrInvalid", tc.consumer, tc.id, err)
		}
		if err := in.Insert(t.Context(), tx, tc.consumer, tc.id); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Insert: %v, want store.ErrInvalid", err)
		}
		if _, err := in.Process(t.Context(), tc.consumer, tc.id, nil); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Process: %v, want store.ErrInvalid", err)
		}
	}
	if _, err := in.Process(t.Context(), "c", "m", nil); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Process with a nil handler: %v, want store.ErrInvalid", err)
	}
	usable(t, tx) // refused before anything reached the server
}

func TestNewRejectsBadConfig(t *testing.T) {
	p := pool(t)
	for _, tc := range []struct {
		name string
		db   inbox.DB
		opts []inbox.Option
	}{
		{"nil db", nil, nil},
		{"empty table", p, []inbox.Option{inbox.WithTable("")}},
		{"long table", p, []inbox.Option{inbox.WithTable(strings.Repeat("t", 47))}},
		{"NUL in table", p, []inbox.Option{inbox.WithTable("a\x00b")}},
		{"long schema", p, []inbox.Option{inbox.WithSchema(strings.Repeat("s", 64))}},
		{"zero retention", p, []inbox.Option{inbox.WithRetention(0)}},
		{"zero batch", p, []inbox.Option{inbox.WithSweepBatch(0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := inbox.New(tc.db, tc.opts...); !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("New: %v, want store.ErrInvalid", err)
			}
		})
	}
}
