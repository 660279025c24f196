package postgres

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// sideTable creates the handler's own table (one row per side effect) next to
// the store's table, in the store's schema.
func sideTable(t testing.TB, pool *pgxpool.Pool, s *Store, extra string) string {
	t.Helper()
	name := s.ident("charges")
	if _, err := pool.Exec(t.Context(), `CREATE TABLE `+name+` (key text NOT NULL, n int NOT NULL DEFAULT 0`+extra+`)`); err != nil {
		t.Fatal(err)
	}
	return name
}

func countRows(t testing.TB, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// expireLease moves id's lease into the past on the server, as if its holder had
// stopped renewing long ago.
func expireLease(t testing.TB, pool *pgxpool.Pool, s *Store, id store.ID) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `UPDATE `+s.Table()+` SET lease_until = now() - interval '1 second' WHERE scope = $1 AND key = $2`,
		[]byte(id.Scope), []byte(id.Key)); err != nil {
		t.Fatal(err)
	}
}

// TestCompleteTx completes a record in the caller's transaction through every kind
// of pgx.Tx: the record is replayed once the transaction commits, and a rollback
// leaves the claim in flight with no side effect.
func TestCompleteTx(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	s := newStore(t, pool, nil)
	side := sideTable(t, pool, s, "")
	conn, err := pgx.Connect(ctx, databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })

	type begun struct {
		tx   pgx.Tx
		done func() // commits an outer transaction, if any
	}
	for _, tc := range []struct {
		name  string
		begin func(t *testing.T) begun
	}{
		{"pool.Begin", func(t *testing.T) begun {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return begun{tx: tx, done: func() {}}
		}},
		{"pool checkout", func(t *testing.T) begun {
			c, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Release)
			tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
			if err != nil {
				t.Fatal(err)
			}
			return begun{tx: tx, done: func() {}}
		}},
		{"caller's own connection", func(t *testing.T) begun {
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return begun{tx: tx, done: func() {}}
		}},
		{"savepoint inside the caller's transaction", func(t *testing.T) begun {
			outer, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tx, err := outer.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return begun{tx: tx, done: func() {
				if err := outer.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, commit := range []bool{true, false} {
				id := newID()
				req := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
				res, err := s.Claim(ctx, req)
				if err != nil || res.Outcome != store.Claimed {
					t.Fatalf("Claim: %+v, %v", res, err)
				}
				b := tc.begin(t)
				if _, err := b.tx.Exec(ctx, `INSERT INTO `+side+` (key) VALUES ($1)`, id.Key); err != nil {
					t.Fatal(err)
				}
				resp := store.Response{Status: 201, Header: http.Header{"Location": {"/charges/1"}}, Body: []byte(`{"id":1}`)}
				if err := s.CompleteTx(ctx, b.tx, id, res.Token, resp, time.Hour); err != nil {
					t.Fatalf("CompleteTx: %v", err)
				}
				if commit {
					err = b.tx.Commit(ctx)
				} else {
					err = b.tx.Rollback(ctx)
				}
				if err != nil {
					t.Fatal(err)
				}
				b.done()
				var n int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+side+` WHERE key = $1`, id.Key).Scan(&n); err != nil {
					t.Fatal(err)
				}
				got, err := s.Claim(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if commit {
					if n != 1 || got.Outcome != store.Completed || got.Record.Status != 201 ||
						string(got.Record.Body) != `{"id":1}` || got.Record.Header.Get("Location") != "/charges/1" {
						t.Fatalf("after commit: %d side rows, claim %+v", n, got)
					}
				} else {
					if n != 0 || got.Outcome != store.InFlight {
						t.Fatalf("after rollback: %d side rows, claim %+v; want none and in flight", n, got)
					}
					if err := s.Complete(ctx, id, res.Token, resp, time.Hour); err != nil {
						t.Fatalf("the claim is still the holder's after a rollback: %v", err)
					}
				}
			}
		})
	}
}

// TestCompleteTxArguments refuses what Complete refuses, before sending anything.
func TestCompleteTxArguments(t *testing.T) {
	s, err := New((*pgxpool.Pool)(nil), WithMaxBody(4))
	if err != nil {
		t.Fatal(err)
	}
	id, tok, ok := store.ID{Key: "k"}, store.NewToken(), store.Response{Status: 200}
	var tx pgx.Tx = nilTx{}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"nil tx", s.CompleteTx(t.Context(), nil, id, tok, ok, time.Hour)},
		{"empty key", s.CompleteTx(t.Context(), tx, store.ID{}, tok, ok, time.Hour)},
		{"zero token", s.CompleteTx(t.Context(), tx, id, store.Token{}, ok, time.Hour)},
		{"status", s.CompleteTx(t.Context(), tx, id, tok, store.Response{Status: 42}, time.Hour)},
		{"retention", s.CompleteTx(t.Context(), tx, id, tok, ok, 0)},
		{"body over the cap", s.CompleteTx(t.Context(), tx, id, tok, store.Response{Status: 200, Body: []byte("12345")}, time.Hour)},
		{"CommitResponse nil tx", s.CommitResponse(t.Context(), nil, httptest.NewRecorder(), ok)},
	} {
		if !errors.Is(tc.err, store.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", tc.name, tc.err)
		}
	}
}

// nilTx is a pgx.Tx that fails every call: argument checks must come first.
type nilTx struct{ pgx.Tx }

// TestCompleteTxStaleHolder: the lease of the first holder expired and a retry took
// the key over while the first holder was still inside its transaction. The stale
// holder's CompleteTx matches no row (ErrLeaseLost), it rolls back, and only the new
// holder's side effect commits.
func TestCompleteTxStaleHolder(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	s := newStore(t, pool, nil)
	side := sideTable(t, pool, s, "")
	id := newID()
	req := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
	first, err := s.Claim(ctx, req)
	if err != nil || first.Outcome != store.Claimed {
		t.Fatalf("Claim: %+v, %v", first, err)
	}
	stale, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Rollback(context.Background())
	if _, err := stale.Exec(ctx, `INSERT INTO `+side+` (key) VALUES ($1)`, "stale"); err != nil {
		t.Fatal(err)
	}

	expireLease(t, pool, s, id)
	second, err := s.Claim(ctx, req)
	if err != nil || second.Outcome != store.Claimed || !second.Takeover {
		t.Fatalf("takeover: %+v, %v", second, err)
	}
	err = s.CompleteTx(ctx, stale, id, first.Token, store.Response{Status: 201, Body: []byte("stale")}, time.Hour)
	if !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("stale CompleteTx: %v, want ErrLeaseLost", err)
	}
	if err := stale.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	fresh, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Exec(ctx, `INSERT INTO `+side+` (key) VALUES ($1)`, "fresh"); err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteTx(ctx, fresh, id, second.Token, store.Response{Status: 201, Body: []byte("fresh")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := fresh.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var keys []string
	rows, _ := pool.Query(ctx, `SELECT key FROM `+side)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(keys) != 1 || keys[0] != "fresh" {
		t.Fatalf("side rows %v (%v), want only the new holder's", keys, err)
	}
	if got, err := s.Claim(ctx, req); err != nil || got.Outcome != store.Completed || string(got.Record.Body) != "fresh" {
		t.Fatalf("replay %+v, %v", got, err)
	}
}

// TestTakeoverWaitsForCompletingTx: the holder completed the record in its
// transaction (the row is locked) and its lease then expired; a retry's takeover
// waits for the transaction instead of running the handler again, and replays the
// committed record.
func TestTakeoverWaitsForCompletingTx(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	s := newStore(t, pool, nil)
	id := newID()
	req := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
	first, err := s.Claim(ctx, req)
	if err != nil || first.Outcome != store.Claimed {
		t.Fatalf("Claim: %+v, %v", first, err)
	}
	expireLease(t, pool, s, id)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if err := s.CompleteTx(ctx, tx, id, first.Token, store.Response{Status: 200, Body: []byte("one")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res store.ClaimResult
		err error
	}
	got := make(chan answer, 1)
	go func() {
		res, err := s.Claim(ctx, req)
		got <- answer{res, err}
	}()
	waitBlockedBy(t, pool, int(tx.Conn().PgConn().PID())) // the claim waits for this transaction's row lock
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil || a.res.Outcome != store.Completed || string(a.res.Record.Body) != "one" {
		t.Fatalf("retry during the holder's transaction: %+v, %v; want the committed replay", a.res, a.err)
	}
}

// countStore counts the middleware's Complete and Release calls.
type countStore struct {
	*Store
	completes, releases atomic.Int32
}

func (c *countStore) Complete(ctx context.Context, id store.ID, tok store.Token, resp store.Response, ret time.Duration) error {
	c.completes.Add(1)
	return c.Store.Complete(ctx, id, tok, resp, ret)
}

func (c *countStore) Release(ctx context.Context, id store.ID, tok store.Token) error {
	c.releases.Add(1)
	return c.Store.Release(ctx, id, tok)
}

type txEnv struct {
	t      *testing.T
	pool   *pgxpool.Pool
	st     *countStore
	side   string
	url    string
	events chan middleware.Event
}

// newTxEnv serves handler behind the middleware over the Postgres store, on real TCP.
func newTxEnv(t *testing.T, handler func(e *txEnv) http.HandlerFunc, opts ...middleware.Option) *txEnv {
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	e := &txEnv{t: t, pool: pool, st: &countStore{Store: s}, side: sideTable(t, pool, s, ""), events: make(chan middleware.Event, 100)}
	m, err := middleware.New(e.st, middleware.GlobalScope, append([]middleware.Option{
		middleware.WithObserver(middleware.ObserverFunc(func(_ context.Context, ev middleware.Event) {
			select {
			case e.events <- ev:
			default: // a storm: nobody reads them
			}
		})),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(handler(e)))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

func (e *txEnv) post(key, body string) (int, http.Header, string) {
	e.t.Helper()
	r, _ := http.NewRequest("POST", e.url+"/charges", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// insertAndCommit is the handler of the common case: one row and the record in one
// transaction, answered with CommitResponse.
func insertAndCommit(e *txEnv) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			http.Error(w, err.Error(), 503)
			return
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		id, _ := middleware.KeyFromContext(ctx)
		var n int
		if err := tx.QueryRow(ctx, `INSERT INTO `+e.side+` (key) VALUES ($1) RETURNING (SELECT count(*) FROM `+e.side+`)`, id.Key).Scan(&n); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"key":"` + id.Key + `"}`)}
		if err := e.st.CommitResponse(ctx, tx, w, resp); err != nil {
			if errors.Is(err, store.ErrLeaseLost) {
				http.Error(w, "taken over", http.StatusConflict)
				return
			}
			http.Error(w, err.Error(), 500)
		}
	}
}

// TestCommitResponseThroughMiddleware: the handler's row and the record commit
// together; the middleware does not complete again, and the retry replays the
// committed response byte for byte.
func TestCommitResponseThroughMiddleware(t *testing.T) {
	e := newTxEnv(t, insertAndCommit)
	code, h, body := e.post("k1", "x")
	if code != 201 || body != `{"key":"k1"}` || h.Get("Content-Type") != "application/json" {
		t.Fatalf("first: %d %v %q", code, h, body)
	}
	if ev := <-e.events; ev.Decision != middleware.Executed || !ev.InTransaction || ev.Err != nil {
		t.Fatalf("event %+v, want executed in transaction", ev)
	}
	code, h, body = e.post("k1", "x")
	if code != 201 || body != `{"key":"k1"}` || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %v %q", code, h, body)
	}
	if n := countRows(e.t, e.pool, e.side); n != 1 || e.st.completes.Load() != 0 || e.st.releases.Load() != 0 {
		t.Fatalf("%d rows, %d Complete and %d Release calls; want 1, 0, 0", n, e.st.completes.Load(), e.st.releases.Load())
	}
}

// TestCommitResponseHandlerWritesMore: a handler that writes more after
// CommitResponse sends it to this client only; retries get the committed response.
func TestCommitResponseHandlerWritesMore(t *testing.T) {
	e := newTxEnv(t, func(e *txEnv) http.HandlerFunc {
		inner := insertAndCommit(e)
		return func(w http.ResponseWriter, r *http.Request) {
			inner(w, r)
			io.WriteString(w, " and more")
		}
	})
	if code, _, body := e.post("k", "x"); code != 201 || body != `{"key":"k"} and more` {
		t.Fatalf("first: %d %q", code, body)
	}
	if code, _, body := e.post("k", "x"); code != 201 || body != `{"key":"k"}` {
		t.Fatalf("retry: %d %q, want the committed response", code, body)
	}
}

// TestCommitResponseWithoutClaim refuses, rolls back and writes nothing when the
// request runs without a claim.
func TestCommitResponseWithoutClaim(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	side := sideTable(t, pool, s, "")
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), `INSERT INTO `+side+` (key) VALUES ('x')`); err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	if err := s.CommitResponse(t.Context(), tx, w, store.Response{Status: 200}); !errors.Is(err, claim.ErrNoClaim) {
		t.Fatalf("CommitResponse without a claim: %v", err)
	}
	if w.Code != 200 || w.Body.Len() != 0 || len(w.Header()) != 0 || w.Flushed {
		t.Fatalf("something was written: %d %v %q", w.Code, w.Header(), w.Body)
	}
	if n := countRows(t, pool, side); n != 0 {
		t.Fatalf("%d rows committed, want 0 (rolled back)", n)
	}
	if err := claim.MarkCompleted(t.Context(), store.Response{Status: 200}); !errors.Is(err, claim.ErrNoClaim) {
		t.Fatalf("MarkCompleted without a claim: %v", err)
	}
}

// TestCommitFailsAfterCompleteTx: the commit fails (a deferred constraint), so
// neither the row nor the record exist; CommitResponse says the outcome is
// unknown, the handler answers 5xx, the middleware releases the claim and the
// retry runs.
func TestCommitFailsAfterCompleteTx(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	e := newTxEnv(t, func(e *txEnv) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				http.Error(w, err.Error(), 503)
				return
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			tx.Exec(ctx, `INSERT INTO `+e.side+` (key) VALUES ('row')`)
			if fail.Load() { // fails at commit only
				tx.Exec(ctx, `INSERT INTO `+e.st.ident("charges_u")+` (n) VALUES (1), (1)`)
			}
			err = e.st.CommitResponse(ctx, tx, w, store.Response{Status: 201, Body: []byte("done")})
			switch {
			case errors.Is(err, ErrCommitUnknown):
				http.Error(w, "outcome unknown", 503)
			case err != nil:
				http.Error(w, err.Error(), 500)
			}
		}
	})
	if _, err := e.pool.Exec(t.Context(), `CREATE TABLE `+e.st.ident("charges_u")+` (n int UNIQUE DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	if code, _, body := e.post("k", "x"); code != 503 || !strings.Contains(body, "outcome unknown") {
		t.Fatalf("first: %d %q", code, body)
	}
	if n := countRows(t, e.pool, e.side); n != 0 || e.st.releases.Load() != 1 {
		t.Fatalf("%d rows after the failed commit, %d releases; want 0, 1", n, e.st.releases.Load())
	}
	fail.Store(false)
	if code, _, body := e.post("k", "x"); code != 201 || body != "done" {
		t.Fatalf("retry: %d %q, want a fresh run", code, body)
	}
	if n := countRows(t, e.pool, e.side); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

// TestReleaseCannotDestroyCommittedRecord: the transaction did commit but the
// handler could not know (its commit answer was lost) and answers 503; the
// middleware's release is fenced by the uncompleted record, so the committed
// record stays and the retry replays it instead of running again.
func TestReleaseCannotDestroyCommittedRecord(t *testing.T) {
	e := newTxEnv(t, func(e *txEnv) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			claim, _ := claim.FromContext(ctx)
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				http.Error(w, err.Error(), 503)
				return
			}
			tx.Exec(ctx, `INSERT INTO `+e.side+` (key) VALUES ('row')`)
			if err := e.st.CompleteTx(ctx, tx, claim.ID, claim.Token, store.Response{Status: 201, Body: []byte("committed")}, claim.Retention); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			tx.Commit(ctx)                        // its answer "lost":
			http.Error(w, "outcome unknown", 503) // no MarkCompleted
		}
	})
	if code, _, _ := e.post("k", "x"); code != 503 {
		t.Fatalf("first: %d", code)
	}
	if ev := <-e.events; ev.Decision != middleware.Released || !errors.Is(ev.Err, store.ErrLeaseLost) {
		t.Fatalf("event %+v, want a release refused with ErrLeaseLost", ev)
	}
	if code, h, body := e.post("k", "x"); code != 201 || body != "committed" || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %q, want the committed replay", code, body)
	}
	if n := countRows(t, e.pool, e.side); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

// TestInTxStorm sends 200 keys 5 times each, concurrently, to a handler that
// inserts a row and completes in its transaction: exactly 200 rows.
func TestInTxStorm(t *testing.T) {
	e := newTxEnv(t, insertAndCommit)
	const keys, copies = 200, 5
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var bad atomic.Int32
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	for k := range keys {
		for range copies {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				key := "storm-" + string(rune('a'+k%26)) + "-" + itoa(k)
				r, _ := http.NewRequest("POST", e.url+"/charges", strings.NewReader("x"))
				r.Header.Set("Idempotency-Key", key)
				resp, err := client.Do(r)
				if err != nil {
					bad.Add(1)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 201 && resp.StatusCode != 409 {
					bad.Add(1)
				}
			})
		}
	}
	wg.Wait()
	var rows, distinct int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*), count(DISTINCT key) FROM `+e.side).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != keys || distinct != keys || bad.Load() != 0 || e.st.completes.Load() != 0 {
		t.Fatalf("%d rows over %d keys, %d unexpected answers, %d Complete calls; want %d rows, 0, 0",
			rows, distinct, bad.Load(), e.st.completes.Load(), keys)
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// TestCommitResponseMisuse: a handler that calls CommitResponse a second time
// (in a new transaction, or the same one), or that writes before it, never
// commits a second side effect nor changes what retries replay.
func TestCommitResponseMisuse(t *testing.T) {
	for _, tc := range []struct {
		name       string
		second     func(e *txEnv, w http.ResponseWriter, r *http.Request, first error) error
		writeFirst bool
		wantFirst  int // the status the first client sees
	}{
		{"twice, a new transaction", func(e *txEnv, w http.ResponseWriter, r *http.Request, _ error) error {
			tx, err := e.pool.Begin(r.Context())
			if err != nil {
				return err
			}
			defer tx.Rollback(context.WithoutCancel(r.Context()))
			if _, err := tx.Exec(r.Context(), `INSERT INTO `+e.side+` (key) VALUES ('second')`); err != nil {
				return err
			}
			err = e.st.CommitResponse(r.Context(), tx, w, store.Response{Status: 200, Body: []byte("second")})
			if !errors.Is(err, store.ErrLeaseLost) {
				e.t.Errorf("second CommitResponse: %v, want ErrLeaseLost", err)
			}
			return nil
		}, false, 201},
		{"handler writes first", nil, true, 202},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTxEnv(t, func(e *txEnv) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					ctx := r.Context()
					if tc.writeFirst {
						w.WriteHeader(202)
					}
					tx, err := e.pool.Begin(ctx)
					if err != nil {
						http.Error(w, err.Error(), 503)
						return
					}
					defer tx.Rollback(context.WithoutCancel(ctx))
					if _, err := tx.Exec(ctx, `INSERT INTO `+e.side+` (key) VALUES ('first')`); err != nil {
						http.Error(w, err.Error(), 503)
						return
					}
					err = e.st.CommitResponse(ctx, tx, w, store.Response{Status: 201, Body: []byte("first")})
					if err != nil {
						t.Errorf("first CommitResponse: %v", err)
					}
					if tc.second != nil {
						if err := tc.second(e, w, r, err); err != nil {
							t.Error(err)
						}
						// The same, committed transaction again.
						if err := e.st.CommitResponse(ctx, tx, w, store.Response{Status: 200, Body: []byte("third")}); err == nil {
							t.Error("CommitResponse on a committed transaction succeeded")
						}
					}
				}
			})
			if code, _, _ := e.post("k", "x"); code != tc.wantFirst {
				t.Fatalf("first: %d, want %d", code, tc.wantFirst)
			}
			if ev := <-e.events; !ev.InTransaction {
				t.Fatalf("event %+v, want in transaction", ev)
			}
			for range 2 {
				if code, h, body := e.post("k", "x"); code != 201 || body != "first" || h.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("retry: %d %q, want the first commit replayed", code, body)
				}
			}
			if n := countRows(t, e.pool, e.side); n != 1 || e.st.completes.Load() != 0 || e.st.releases.Load() != 0 {
				t.Fatalf("%d rows, %d completes, %d releases; want 1, 0, 0", n, e.st.completes.Load(), e.st.releases.Load())
			}
		})
	}
}
