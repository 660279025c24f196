package postgres

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// stopBeforeCommit runs stop just before the next commit statement is sent, once
// armed: the server hangs with the handler's transaction completed but not
// committed.
type stopBeforeCommit struct {
	armed atomic.Bool
	stop  func()
}

func (s *stopBeforeCommit) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.EqualFold(d.SQL, "commit") && s.armed.CompareAndSwap(true, false) {
		s.stop()
	}
	return ctx
}

func (s *stopBeforeCommit) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestCommitResponseBoundedOnHungServer: the private cluster is SIGSTOPped just
// before CommitResponse's commit. The handler's context has no deadline (the
// middleware detaches it from the client's), yet the commit gives up after the
// completion bound with ErrCommitUnknown, and the client has its 503 within that
// bound and the release's, not when TCP gives up. After SIGCONT the retry sees
// the truth, with one execution: the replay of the record that committed (or a
// run, had it not).
func TestCommitResponseBoundedOnHungServer(t *testing.T) {
	c := startCluster(t)
	var stopped atomic.Bool
	resume := func() {
		if stopped.CompareAndSwap(true, false) {
			c.Signal(t, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume) // before the cluster's destroy
	tr := &stopBeforeCommit{stop: func() { stopped.Store(true); c.Signal(t, syscall.SIGSTOP) }}
	pool := newPool(t, c.url(), func(cfg *pgxpool.Config) { cfg.MaxConns = 4; cfg.ConnConfig.Tracer = tr })
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
	const complete, release = 500 * time.Millisecond, 500 * time.Millisecond
	m, err := middleware.New(s, middleware.GlobalScope, middleware.WithStoreFailure(policy.StoreFailureRule{
		Timeouts: claim.Timeouts{Complete: complete, Release: release}}))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	errs := make(chan error, 2)
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		ctx := r.Context()
		tx, err := pool.Begin(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if _, err := tx.Exec(ctx, `INSERT INTO side (key) VALUES ('k')`); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		err = s.CommitResponse(ctx, tx, w, store.Response{Status: 201, Body: []byte("committed")})
		errs <- err
		if err != nil {
			http.Error(w, "commit outcome unknown", http.StatusServiceUnavailable)
		}
	})))
	defer srv.Close()
	defer resume() // before srv.Close, which waits for a handler held by the stopped server
	client := &http.Client{Timeout: 5 * time.Second}
	post := func() (int, string, error) {
		r, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", "k")
		resp, err := client.Do(r)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}

	tr.armed.Store(true)
	t0 := time.Now()
	code, _, err := post()
	took := time.Since(t0)
	if err != nil {
		t.Fatalf("no answer while the server hung (%v after %v); want 503 within the completion and release bounds (%v)", err, took, complete+release)
	}
	if max := complete + release + 1500*time.Millisecond; code != http.StatusServiceUnavailable || took > max {
		t.Fatalf("hung commit: %d after %v; want 503 within %v", code, took, max)
	}
	if err := <-errs; !errors.Is(err, ErrCommitUnknown) {
		t.Fatalf("CommitResponse: %v; want ErrCommitUnknown", err)
	}
	t.Logf("hung commit answered %d after %v (bounds: complete %v, release %v)", code, took, complete, release)
	resume()

	// The retry's claim waits on the record's row lock until the resumed server has
	// run the commit it was sent; a commit that did not land leaves a claim the
	// background release frees (409 until then).
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body, err := post()
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusConflict && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond) // polling the background release through the API
			continue
		}
		var rows int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM side`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		replayed, ranAgain := runs.Load() == 1, runs.Load() == 2
		if code != 201 || body != "committed" || rows != 1 || !replayed && !ranAgain {
			t.Fatalf("retry after SIGCONT: %d %q, %d rows, %d runs; want 201 \"committed\", 1 row", code, body, rows, runs.Load())
		}
		t.Logf("retry after SIGCONT: %d %q, %d runs (replayed %v)", code, body, runs.Load(), replayed)
		return
	}
}
