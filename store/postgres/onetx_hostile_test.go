package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/idem"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// logLines records log messages.
type logLines struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }
func (l *logLines) count(part string) (n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, part) {
			n++
		}
	}
	return n
}

// TestOneTxAbortedThenAnswered: a handler whose statement failed (aborting its
// transaction: a division by zero, an invalid input, an unknown table) after
// it wrote a row, and which then answers a status the middleware stores, gets
// that status, stored: every retry replays it, the handler ran once, its row is
// gone (the record committed on its own) and the log says so. A status the
// middleware releases for still releases: the retry runs again.
func TestOneTxAbortedThenAnswered(t *testing.T) {
	logs := &logLines{}
	fails := []string{`SELECT 1/0`, `INSERT INTO %[1]s (key, n) VALUES ('x', 'not a number')`, `SELECT * FROM idemkey_no_such_table`}
	runs := map[string]int{}
	var mu sync.Mutex
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			tx, _ := TxFromContext(r.Context())
			id, _ := middleware.KeyFromContext(r.Context())
			mu.Lock()
			runs[id.Key]++
			mu.Unlock()
			var status, fail int
			fmt.Sscanf(id.Key, "%d-%d", &status, &fail)
			if _, err := tx.Exec(r.Context(), `INSERT INTO `+e.side+` (key) VALUES ($1)`, id.Key); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			if _, err := tx.Exec(r.Context(), fmt.Sprintf(fails[fail], e.side)); err == nil {
				t.Errorf("%s did not fail", fails[fail])
			}
			w.WriteHeader(status)
			fmt.Fprintf(w, "answered %d", status)
		}
	}, nil, middleware.WithLogger(slog.New(logs)))
	for _, status := range []int{200, 201, 400, 404, 422, 500, 503} {
		for fail := range fails {
			key := fmt.Sprintf("%d-%d", status, fail)
			for attempt := range 2 {
				code, h, body, err := e.post(key)
				if err != nil || code != status || body != fmt.Sprintf("answered %d", status) {
					t.Fatalf("%s attempt %d: %d %q %v; want the handler's %d", key, attempt, code, body, err, status)
				}
				replayed := h.Get("Idempotent-Replayed") == "true"
				if stored := status < 500; replayed != (stored && attempt == 1) {
					t.Fatalf("%s attempt %d: replayed=%v", key, attempt, replayed)
				}
			}
			want := 1
			if status >= 500 {
				want = 2
			}
			if runs[key] != want {
				t.Fatalf("%s: %d runs, want %d", key, runs[key], want)
			}
		}
	}
	if rows, _, records := e.counts(); rows != 0 || records != 5*len(fails) {
		t.Fatalf("%d rows, %d records; want no row (every transaction aborted) and %d records", rows, records, 5*len(fails))
	}
	if n := logs.count("aborted the handler's transaction"); n != 5*len(fails) {
		t.Fatalf("%d log lines about an aborted transaction, want %d", n, 5*len(fails))
	}
}

// TestOneTxHandlerCannotEndTx: whatever statement the handler sends to end its
// transaction (COMMIT, COMMIT AND CHAIN, COMMIT; BEGIN, ROLLBACK, END, ...) is
// refused with ErrTxOwned and not sent, so the key's lock holds: a duplicate
// sent while the handler still runs is answered 409 and never runs the
// handler, and the first request commits its row with its record, once.
func TestOneTxHandlerCannotEndTx(t *testing.T) {
	stmts := []string{"COMMIT", "COMMIT AND CHAIN", "COMMIT; BEGIN", "ROLLBACK", "ROLLBACK AND CHAIN", "END", "ABORT",
		"/* x */ commit", "SELECT 1; COMMIT", "PREPARE TRANSACTION 'idemkey_x'"}
	entered, proceed := make(chan struct{}), make(chan struct{})
	errs := make([]error, len(stmts))
	runs := make([]int, len(stmts))
	var mu sync.Mutex
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			tx, _ := TxFromContext(r.Context())
			id, _ := middleware.KeyFromContext(r.Context())
			var i int
			fmt.Sscanf(id.Key, "end-%d", &i)
			mu.Lock()
			runs[i]++
			first := runs[i] == 1
			mu.Unlock()
			_, err := tx.Exec(r.Context(), stmts[i])
			if first {
				errs[i] = err
				entered <- struct{}{}
				<-proceed
			}
			if _, err := tx.Exec(r.Context(), `INSERT INTO `+e.side+` (key) VALUES ($1)`, id.Key); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			w.WriteHeader(201)
		}
	}, []TxOption{WithLockWait(100 * time.Millisecond)})
	for i := range stmts {
		key := fmt.Sprint("end-", i)
		first := make(chan int, 1)
		go func() { code, _, _, _ := e.post(key); first <- code }()
		<-entered
		if code, _, body, err := e.post(key); err != nil || code != http.StatusConflict {
			t.Errorf("%q: duplicate while the first runs: %d %q %v; want 409", stmts[i], code, body, err)
		}
		proceed <- struct{}{}
		if code := <-first; code != 201 {
			t.Errorf("%q: first answered %d, want 201", stmts[i], code)
		}
		if !errors.Is(errs[i], ErrTxOwned) || runs[i] != 1 {
			t.Errorf("%q: %v after %d runs; want ErrTxOwned, 1 run", stmts[i], errs[i], runs[i])
		}
	}
	if rows, distinct, records := e.counts(); rows != len(stmts) || distinct != len(stmts) || records != len(stmts) {
		t.Fatalf("%d rows over %d keys, %d records; want %d of each", rows, distinct, records, len(stmts))
	}
}

// TestOneTxSideDoorFailsClosed: a handler that ends its transaction through
// the side door (its connection: COMMIT, ROLLBACK, COMMIT AND CHAIN, then a row
// written outside it) and answers 201 gets no 2xx: the commit's fence finds the
// transaction is not the claim's, the client gets 503 store_unavailable (the
// configured problem), the log says so, and the key stays claimed for the
// lease: the retry is answered 409 and runs nothing.
func TestOneTxSideDoorFailsClosed(t *testing.T) {
	logs := &logLines{}
	doors := []string{"COMMIT", "ROLLBACK", "COMMIT AND CHAIN", "ROLLBACK AND CHAIN", "COMMIT; BEGIN"}
	runs := make([]int, len(doors))
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			tx, _ := TxFromContext(r.Context())
			id, _ := middleware.KeyFromContext(r.Context())
			var i int
			fmt.Sscanf(id.Key, "door-%d", &i)
			runs[i]++
			conn := tx.Conn()
			if _, err := conn.Exec(r.Context(), doors[i]); err != nil {
				t.Error(err)
			}
			if _, err := conn.Exec(r.Context(), `INSERT INTO `+e.side+` (key) VALUES ($1)`, id.Key); err != nil {
				t.Error(err)
			}
			w.WriteHeader(201)
		}
	}, []TxOption{WithLockWait(100 * time.Millisecond)}, middleware.WithLogger(slog.New(logs)))
	for i := range doors {
		key := fmt.Sprint("door-", i)
		if code, _, body, err := e.post(key); err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "store_unavailable") {
			t.Errorf("%q: %d %q %v; want 503 store_unavailable", doors[i], code, body, err)
		}
		if code, _, body, err := e.post(key); err != nil || code != http.StatusConflict || runs[i] != 1 {
			t.Errorf("%q: retry %d %q %v after %d runs; want 409 (the key kept for its lease), 1 run", doors[i], code, body, err, runs[i])
		}
	}
	if n := logs.count("ended or left its transaction"); n != len(doors) {
		t.Fatalf("%d log lines about a transaction ended by the handler, want %d", n, len(doors))
	}
}

// TestOneTxCommitFenced: the completion proves on the server that the
// transaction is still the claim's: one chained after the claim's commit (same
// connection, status in a transaction, so nothing in Go can tell) is refused
// with claim.ErrTxEnded, no record is written, and the key stays claimed.
func TestOneTxCommitFenced(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	ts, err := s.OneTx(pool, WithLockWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	id := newID()
	req := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
	res, tx, err := ts.ClaimTx(t.Context(), req)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatal(res, err)
	}
	if _, err := tx.(*txClaim).handler.Conn().Exec(t.Context(), "COMMIT AND CHAIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(t.Context(), store.Response{Status: 201}, time.Hour); !errors.Is(err, claim.ErrTxEnded) {
		t.Fatalf("Commit = %v, want claim.ErrTxEnded", err)
	}
	var completed int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM `+s.Table()+` WHERE status IS NOT NULL`).Scan(&completed); err != nil || completed != 0 {
		t.Fatalf("%d records (%v), want none", completed, err)
	}
	if res, _, err := ts.ClaimTx(t.Context(), req); err != nil || res.Outcome != store.InFlight {
		t.Fatalf("claim after: %+v %v; want in flight (the key kept for its lease)", res, err)
	}
}

// TestOneTxHungServerBounded: with the private cluster SIGSTOPped while the
// handler is between two statements, its second statement fails within the
// statement timeout (a context deadline on the connection), so the client has
// its answer (the handler's 500) within the handler's time plus one bound, not
// when the server resumes; after SIGCONT the retry runs once.
func TestOneTxHungServerBounded(t *testing.T) {
	c := startCluster(t)
	var stopped sync.Once
	resumed := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-resumed:
		default:
			c.Signal(t, syscall.SIGCONT)
		}
	})
	pool := newPool(t, c.url(), func(cfg *pgxpool.Config) { cfg.MaxConns = 4 })
	s, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE side (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const bound = time.Second
	ts, err := s.OneTx(pool, WithStatementTimeout(bound))
	if err != nil {
		t.Fatal(err)
	}
	m, err := middleware.New(ts, middleware.GlobalScope, middleware.WithStoreFailure(policy.StoreFailureRule{
		Timeouts: claim.Timeouts{Complete: bound, Release: bound}}))
	if err != nil {
		t.Fatal(err)
	}
	e := &oneTxEnv{t: t, pool: pool, client: &http.Client{}}
	srv := newServer(t, m.OneTx(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := TxFromContext(r.Context())
		for i := range 2 {
			if i == 1 {
				stopped.Do(func() { c.Signal(t, syscall.SIGSTOP) })
			}
			if _, err := tx.Exec(r.Context(), `INSERT INTO side (key) VALUES ('k')`); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
		}
		w.WriteHeader(201)
	})))
	e.url = srv
	t0 := time.Now()
	code, _, _, err := e.post("hung-1")
	took := time.Since(t0)
	c.Signal(t, syscall.SIGCONT)
	close(resumed)
	if err != nil || code != 500 || took > 4*bound {
		t.Fatalf("answer %d %v after %v; want the handler's 500 within about %v (the statement bound and its connection's close)", code, err, took, 2*bound)
	}
	if code, _, _, err := e.post("hung-1"); err != nil || code != 201 || countRows(t, pool, "side") != 2 {
		t.Fatalf("retry after SIGCONT: %d %v with %d rows; want 201 and the retry's 2 rows", code, err, countRows(t, pool, "side"))
	}
}

// newServer serves h over TCP until the test ends and returns its URL.
func newServer(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestOneTxIdemDoTx: idem selects the one-transaction mode per call (DoTx): fn's
// row and the result commit once; the repeat replays without running fn; an
// error the release policy releases rolls fn's row back; a plain Do on the same
// runner gets no transaction.
func TestOneTxIdemDoTx(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	side := sideTable(t, pool, s, "")
	ts, err := s.OneTx(pool)
	if err != nil {
		t.Fatal(err)
	}
	r, err := idem.New(ts)
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	fn := func(fail bool) idem.Func {
		return func(ctx context.Context) ([]byte, error) {
			runs++
			tx, ok := TxFromContext(ctx)
			if !ok {
				return nil, errors.New("no transaction")
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+side+` (key) VALUES ('k')`); err != nil {
				return nil, err
			}
			if fail {
				return nil, errors.New("declined")
			}
			return []byte("done"), nil
		}
	}
	id := newID()
	if _, err := r.DoTx(t.Context(), id, fingerprint("a"), fn(true)); err == nil || countRows(t, pool, side) != 0 {
		t.Fatalf("released error: %v with %d rows; want fn's error, its row rolled back", err, countRows(t, pool, side))
	}
	for i := range 2 {
		res, err := r.DoTx(t.Context(), id, fingerprint("a"), fn(false))
		if err != nil || string(res.Value) != "done" || res.Replayed != (i == 1) {
			t.Fatalf("call %d: %+v %v", i, res, err)
		}
	}
	if runs != 2 || countRows(t, pool, side) != 1 {
		t.Fatalf("%d runs, %d rows; want 2 runs (the released one, the first) and 1 row", runs, countRows(t, pool, side))
	}
	if _, err := r.Do(t.Context(), newID(), fingerprint("b"), fn(false)); err == nil {
		t.Fatal("Do ran fn in a transaction")
	}
}
