package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// oneTxEnv serves a one-transaction route (POST /orders) over real TCP.
type oneTxEnv struct {
	t      *testing.T
	pool   *pgxpool.Pool
	st     *Store
	ts     *TxStore
	side   string
	url    string
	client *http.Client
}

// newOneTxEnv serves handler on a one-transaction route; pool may be nil (a
// fresh pool of 20 connections).
func newOneTxEnv(t *testing.T, pool *pgxpool.Pool, handler func(e *oneTxEnv) http.HandlerFunc, txOpts []TxOption, opts ...middleware.Option) *oneTxEnv {
	t.Helper()
	if pool == nil {
		pool = newPool(t, "", func(c *pgxpool.Config) { c.MaxConns = 20 })
	}
	s := newStore(t, pool, nil)
	ts, m := oneTxMiddleware(t, s, pool, txOpts, opts...)
	e := &oneTxEnv{t: t, pool: pool, st: s, ts: ts, side: sideTable(t, pool, s, ""),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	srv := httptest.NewServer(m.OneTx(handler(e)))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

// oneTxMiddleware returns the one-transaction mode of s on pool and the
// middleware on it (global scope).
func oneTxMiddleware(t testing.TB, s *Store, pool *pgxpool.Pool, txOpts []TxOption, opts ...middleware.Option) (*TxStore, *middleware.Middleware) {
	t.Helper()
	ts, err := s.OneTx(pool, txOpts...)
	if err != nil {
		t.Fatal(err)
	}
	m, err := middleware.New(ts, middleware.GlobalScope, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ts, m
}

func (e *oneTxEnv) post(key string) (int, http.Header, string, error) {
	r, _ := http.NewRequest("POST", e.url+"/orders", strings.NewReader("x"))
	r.Header.Set("Idempotency-Key", key)
	resp, err := e.client.Do(r)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), err
}

// insertInTx is the one-transaction handler: one row in the request's
// transaction, answered 201 with the row's own id (so a second execution would
// answer differently).
func insertInTx(e *oneTxEnv) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tx, ok := TxFromContext(r.Context())
		if !ok {
			http.Error(w, "no transaction", 500)
			return
		}
		id, _ := middleware.KeyFromContext(r.Context())
		var ctid string
		if err := tx.QueryRow(r.Context(), `INSERT INTO `+e.side+` (key) VALUES ($1) RETURNING ctid::text || txid_current()`, id.Key).Scan(&ctid); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprintf(w, `{"key":%q,"row":%q}`, id.Key, ctid)
	}
}

func (e *oneTxEnv) counts() (rows, distinct, records int) {
	e.t.Helper()
	ctx := context.Background()
	if err := e.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT key) FROM `+e.side).Scan(&rows, &distinct); err != nil {
		e.t.Fatal(err)
	}
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.st.Table()+` WHERE status IS NOT NULL`).Scan(&records); err != nil {
		e.t.Fatal(err)
	}
	return rows, distinct, records
}

// TestOneTxStorm: 300 keys, 5 concurrent copies each, on a one-transaction
// route: exactly 300 rows and 300 records, and every copy's answer is the
// first's, byte for byte (the duplicates waited on the row lock and replayed).
func TestOneTxStorm(t *testing.T) {
	e := newOneTxEnv(t, nil, insertInTx, []TxOption{WithLockWait(20 * time.Second)},
		middleware.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: 30 * time.Second}}))
	const keys, copies = 300, 5
	answers := e.storm("storm", keys, copies, 48)
	for k, a := range answers {
		firsts := 0
		for c, x := range a {
			if strings.HasPrefix(x, "first ") {
				firsts++
				a[c] = strings.TrimPrefix(x, "first ")
			}
		}
		if firsts != 1 {
			t.Fatalf("key %d: %d first executions among %q", k, firsts, a)
		}
		if !strings.HasPrefix(a[0], "201 ") {
			t.Fatalf("key %d: first answer %q", k, a[0])
		}
		for c := 1; c < copies; c++ {
			if a[c] != a[0] {
				t.Fatalf("key %d: copy %d answered %q, the first %q", k, c, a[c], a[0])
			}
		}
	}
	if rows, distinct, records := e.counts(); rows != keys || distinct != keys || records != keys {
		t.Fatalf("%d rows over %d keys, %d records; want %d of each", rows, distinct, records, keys)
	}
}

// storm posts keys keys (prefix-k), copies concurrent copies of each, at most
// par at a time, and returns each copy's answer ("status body", or the error),
// marked "first " when it is a 201 not marked as a replay.
func (e *oneTxEnv) storm(prefix string, keys, copies, par int) [][]string {
	answers := make([][]string, keys)
	for k := range answers {
		answers[k] = make([]string, copies)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, par)
	for k := range keys {
		for c := range copies {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				code, h, body, err := e.post(fmt.Sprintf("%s-%d", prefix, k))
				if err != nil {
					body = err.Error()
				}
				answers[k][c] = fmt.Sprint(code, " ", body)
				if code == 201 && h.Get("Idempotent-Replayed") == "" {
					answers[k][c] = "first " + answers[k][c]
				}
			})
		}
	}
	wg.Wait()
	return answers
}

// TestOneTxHandlerErrorReleases: a handler that inserts its row and answers 500
// leaves neither the row nor a record, and the retry runs (then commits once).
func TestOneTxHandlerErrorReleases(t *testing.T) {
	var mu sync.Mutex
	fail := true
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		ok := insertInTx(e)
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			f := fail
			mu.Unlock()
			if !f {
				ok(w, r)
				return
			}
			tx, _ := TxFromContext(r.Context())
			if _, err := tx.Exec(r.Context(), `INSERT INTO `+e.side+` (key) VALUES ('doomed')`); err != nil {
				t.Error(err)
			}
			http.Error(w, "boom", 500)
		}
	}, nil)
	if code, _, body, err := e.post("err-1"); err != nil || code != 500 || !strings.Contains(body, "boom") {
		t.Fatalf("first: %d %q %v", code, body, err)
	}
	var n int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM `+e.st.Table()).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d records after the 500 (%v), want none", n, err)
	}
	if rows, _, _ := e.counts(); rows != 0 {
		t.Fatalf("%d rows after the 500, want 0 (rolled back)", rows)
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	code, h, body, err := e.post("err-1")
	if err != nil || code != 201 || h.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %d %q replayed=%q %v; want a fresh 201", code, body, h.Get("Idempotent-Replayed"), err)
	}
	if rows, _, records := e.counts(); rows != 1 || records != 1 {
		t.Fatalf("%d rows, %d records; want 1 and 1", rows, records)
	}
}

// waitForLockWaiter returns once a backend of pool waits on a lock with a
// statement on table.
func waitForLockWaiter(t *testing.T, e *oneTxEnv, key string) {
	t.Helper()
	lock := uint64(e.ts.keyLock(store.ID{Key: key}))
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND NOT granted AND classid = $1 AND objid = $2 AND objsubid = 1`,
			uint32(lock>>32), uint32(lock)).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond) // polling the server's state: no event to wait on
	}
	t.Fatal("no duplicate waits on the key's lock")
}

// TestOneTxDuplicateWaitsOnLock: a duplicate that arrives while the first holds
// the row lock gets the first's answer (a replay) once it commits within the
// lock wait, and 409 when the lock wait runs out first.
func TestOneTxDuplicateWaitsOnLock(t *testing.T) {
	entered := make(chan struct{}, 4)
	proceed := make(chan struct{})
	handler := func(e *oneTxEnv) http.HandlerFunc {
		inner := insertInTx(e)
		return func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-proceed
			inner(w, r)
		}
	}
	type answer struct {
		code     int
		replayed string
		body     string
		err      error
	}
	send := func(e *oneTxEnv, key string) chan answer {
		c := make(chan answer, 1)
		go func() {
			code, h, body, err := e.post(key)
			c <- answer{code, h.Get("Idempotent-Replayed"), body, err}
		}()
		return c
	}
	t.Run("commits within the bound", func(t *testing.T) {
		proceed = make(chan struct{})
		e := newOneTxEnv(t, nil, handler, []TxOption{WithLockWait(15 * time.Second)},
			middleware.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: 20 * time.Second}}))
		release := sync.OnceFunc(func() { close(proceed) })
		t.Cleanup(release) // before the server closes, should the test fail first
		first := send(e, "lock-1")
		<-entered
		dup := send(e, "lock-1")
		waitForLockWaiter(t, e, "lock-1")
		release()
		a, b := <-first, <-dup
		if a.err != nil || a.code != 201 || b.err != nil || b.code != 201 || b.replayed != "true" || b.body != a.body {
			t.Fatalf("first %+v, duplicate %+v; want 201 and its replay", a, b)
		}
	})
	t.Run("bound runs out", func(t *testing.T) {
		proceed = make(chan struct{})
		e := newOneTxEnv(t, nil, handler, []TxOption{WithLockWait(100 * time.Millisecond)})
		release := sync.OnceFunc(func() { close(proceed) })
		t.Cleanup(release)
		first := send(e, "lock-2")
		<-entered
		b := <-send(e, "lock-2")
		if b.err != nil || b.code != http.StatusConflict {
			t.Fatalf("duplicate %+v; want 409 while the first holds the lock", b)
		}
		release()
		if a := <-first; a.err != nil || a.code != 201 {
			t.Fatalf("first %+v", a)
		}
		if rows, _, records := e.counts(); rows != 1 || records != 1 {
			t.Fatalf("%d rows, %d records; want 1 and 1", rows, records)
		}
	})
}

// trafficTracer counts what pgx sends: round trips (a query, or a batch), the
// statements in them and the COMMITs.
type trafficTracer struct {
	mu                        sync.Mutex
	trips, statements, commit int
	texts                     map[string]bool // every statement's text seen
}

func (c *trafficTracer) add(trips int, sql string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips += trips
	c.statements++
	if c.texts == nil {
		c.texts = map[string]bool{}
	}
	c.texts[sql] = true
	if strings.EqualFold(strings.TrimSpace(sql), "commit") {
		c.commit++
	}
}

func (c *trafficTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.add(1, d.SQL)
	return ctx
}
func (c *trafficTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *trafficTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.mu.Lock()
	c.trips++
	c.mu.Unlock()
	return ctx
}
func (c *trafficTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.add(0, d.SQL)
}
func (c *trafficTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *trafficTracer) take() (trips, statements, commits int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	trips, statements, commits = c.trips, c.statements, c.commit
	c.trips, c.statements, c.commit = 0, 0, 0
	return
}

// TestOneTxTraffic: a first execution on a one-transaction route costs at most
// one round trip, three statements (the key's lock, the read of its record, the
// record) and no commit more than the same handler alone (begin, insert,
// commit); a claim whose key no one holds does not touch lock_timeout (the
// lock is tried, not waited for); a replay is one round trip and commits
// nothing.
func TestOneTxTraffic(t *testing.T) {
	tracer := &trafficTracer{}
	pool := newPool(t, "", func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer; c.MaxConns = 1 })
	e := newOneTxEnv(t, pool, insertInTx, nil)
	alone := func() {
		tx, err := pool.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(t.Context())
		var s string
		if err := tx.QueryRow(t.Context(), `INSERT INTO `+e.side+` (key) VALUES ($1) RETURNING ctid::text || txid_current()`, "alone").Scan(&s); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 { // warm the statement caches
		alone()
		if code, _, _, err := e.post(fmt.Sprint("warm-", i)); err != nil || code != 201 {
			t.Fatal(code, err)
		}
	}
	tracer.take()
	alone()
	aTrips, aStmts, aCommits := tracer.take()
	if code, _, _, err := e.post("first"); err != nil || code != 201 {
		t.Fatal(code, err)
	}
	trips, stmts, commits := tracer.take()
	t.Logf("handler alone: %d round trips, %d statements, %d commits; one transaction: %d, %d, %d",
		aTrips, aStmts, aCommits, trips, stmts, commits)
	if trips > aTrips+1 || commits != aCommits || aCommits != 1 || stmts > aStmts+3 {
		t.Fatalf("first execution: %d round trips, %d statements, %d commits; the handler alone %d, %d and %d",
			trips, stmts, commits, aTrips, aStmts, aCommits)
	}
	tracer.mu.Lock()
	for sql := range tracer.texts { // every claim so far met no holder
		if strings.Contains(sql, "lock_timeout") {
			t.Errorf("a claim that met no holder of its key sent %q; want the lock tried without a lock wait", sql)
		}
	}
	tracer.mu.Unlock()
	if code, h, _, err := e.post("first"); err != nil || code != 201 || h.Get("Idempotent-Replayed") != "true" {
		t.Fatal(code, err)
	}
	// The replay's ROLLBACK runs after the answer; wait for the pool to get its
	// connection back before counting.
	c, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	c.Release()
	trips, _, commits = tracer.take()
	if trips != 2 || commits != 0 {
		t.Fatalf("replay: %d round trips (the claim, then the ROLLBACK after the answer), %d commits; want 2 and 0", trips, commits)
	}
}

// TestOneTxArguments: OneTx refuses what it cannot run; the transaction's own
// Commit and Rollback are refused, and it is closed once the handler returned.
func TestOneTxArguments(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	for _, bad := range []func() (*TxStore, error){
		func() (*TxStore, error) { return s.OneTx(nil) },
		func() (*TxStore, error) { return s.OneTx(pool, WithLockWait(0)) },
		func() (*TxStore, error) { return s.OneTx(pool, WithLockWait(-time.Second)) },
		func() (*TxStore, error) { return s.OneTx(pool, WithLockWait(30*24*time.Hour)) },
	} {
		if _, err := bad(); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("OneTx: %v, want ErrInvalid", err)
		}
	}
	var leaked pgx.Tx
	e := newOneTxEnv(t, pool, func(e *oneTxEnv) http.HandlerFunc {
		ok := insertInTx(e)
		return func(w http.ResponseWriter, r *http.Request) {
			tx, _ := TxFromContext(r.Context())
			if err := tx.Commit(r.Context()); !errors.Is(err, ErrTxOwned) {
				t.Errorf("Commit: %v", err)
			}
			if err := tx.Rollback(r.Context()); !errors.Is(err, ErrTxOwned) {
				t.Errorf("Rollback: %v", err)
			}
			leaked = tx
			ok(w, r)
		}
	}, nil)
	if code, _, _, err := e.post("args-1"); err != nil || code != 201 {
		t.Fatal(code, err)
	}
	if _, err := leaked.Exec(t.Context(), "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Exec after the handler returned: %v, want ErrTxClosed", err)
	}
	if _, ok := TxFromContext(t.Context()); ok {
		t.Fatal("a transaction outside a route")
	}
}

// TestOneTxClaimTextConstant: the claim's statements have the same text
// whatever the lock wait (a claim context's deadline shortens it), so each is
// prepared once per connection, not once per request (pgx's statement cache).
func TestOneTxClaimTextConstant(t *testing.T) {
	tracer := &trafficTracer{}
	pool := newPool(t, "", func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer; c.MaxConns = 1 })
	s := newStore(t, pool, nil)
	ts, err := s.OneTx(pool)
	if err != nil {
		t.Fatal(err)
	}
	texts := make([]int, 0, 3)
	for i, bound := range []time.Duration{time.Hour, 900 * time.Millisecond, 300 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(t.Context(), bound)
		id := store.ID{Scope: "s", Key: fmt.Sprint("text-", i)}
		res, tx, err := ts.ClaimTx(ctx, store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Second, Retention: time.Hour})
		if err != nil || res.Outcome != store.Claimed {
			t.Fatal(res, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		tracer.mu.Lock()
		texts = append(texts, len(tracer.texts))
		tracer.mu.Unlock()
	}
	if texts[1] != texts[0] || texts[2] != texts[0] {
		t.Fatalf("distinct statement texts after each claim: %v; want the same count (no text per lock wait)", texts)
	}
}

// TestOneTxHandlerLockTimeout: the handler's statements run under the
// connection's own lock_timeout (here 250ms, set at connect), not under the
// claim's lock wait, which bounds only the wait for the key's lock: both for a
// claim that met no holder (the lock tried, lock_timeout untouched) and for one
// that waited for the key's lock (keyLockSQL sets lock_timeout and must set it
// back): here the holder answers 500, so the duplicate that waited claims and
// runs the handler.
func TestOneTxHandlerLockTimeout(t *testing.T) {
	pool := newPool(t, "", func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["lock_timeout"] = "250ms" })
	entered, proceed := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	hold := false // the next request to enter holds the key, then answers 500
	e := newOneTxEnv(t, pool, func(*oneTxEnv) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			tx, ok := TxFromContext(r.Context())
			if !ok {
				http.Error(w, "no transaction", 500)
				return
			}
			mu.Lock()
			holder := hold
			hold = false
			mu.Unlock()
			if holder {
				entered <- struct{}{}
				<-proceed
				http.Error(w, "rolled back", 500)
				return
			}
			var v string
			if err := tx.QueryRow(r.Context(), `SELECT current_setting('lock_timeout')`).Scan(&v); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			w.WriteHeader(201)
			fmt.Fprint(w, v)
		}
	}, []TxOption{WithLockWait(15 * time.Second)},
		middleware.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: 40 * time.Second}}))
	code, _, body, err := e.post("timeout")
	if err != nil || code != 201 || body != "250ms" {
		t.Fatalf("%d %q %v; want 201 and the connection's lock_timeout 250ms", code, body, err)
	}
	release := sync.OnceFunc(func() { close(proceed) })
	t.Cleanup(release) // before the server closes, should the test fail first
	mu.Lock()
	hold = true
	mu.Unlock()
	first := make(chan int, 1)
	go func() {
		code, _, _, _ := e.post("waited")
		first <- code
	}()
	<-entered
	dup := make(chan string, 1)
	go func() {
		code, _, body, err := e.post("waited")
		dup <- fmt.Sprint(code, " ", body, " ", err)
	}()
	waitForLockWaiter(t, e, "waited")
	release()
	if c := <-first; c != 500 {
		t.Fatalf("holder: %d, want 500", c)
	}
	if got := <-dup; got != "201 250ms <nil>" {
		t.Fatalf("the duplicate that waited for the key's lock: %q; want 201 and the connection's lock_timeout 250ms", got)
	}
}
