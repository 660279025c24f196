package postgres

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/store"
)

// sqlTracer records the statements pgx sends (Query, QueryRow, Exec).
type sqlTracer struct {
	mu  sync.Mutex
	sql []string
}

func (c *sqlTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	c.sql = append(c.sql, d.SQL)
	c.mu.Unlock()
	return ctx
}

func (c *sqlTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the statements sent since the last take, each "read" (no
// INSERT in it) or "claim" (an INSERT).
func (c *sqlTracer) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	kinds := make([]string, len(c.sql))
	for i, sql := range c.sql {
		kinds[i] = "read"
		if strings.Contains(strings.ToUpper(sql), "INSERT") {
			kinds[i] = "claim"
		}
	}
	c.sql = nil
	return kinds
}

// TestClaimReadsFirst: with WithReadFirst, a claim the key's row decides
// without a write (a replay, a mismatch, an in-flight duplicate, a lapsed lease
// of another fingerprint) is one statement, a read; a new key, an expired record
// and a lapsed lease are the read, then the claim statement, which writes.
// Without the option every claim is the claim statement alone.
func TestClaimReadsFirst(t *testing.T) {
	tracer := &sqlTracer{}
	admin := newPool(t, "")
	traced := newPool(t, "", func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	plain := newStore(t, admin, traced)
	if _, err := plain.Claim(t.Context(), store.ClaimRequest{ID: newID(), Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if got := tracer.take(); strings.Join(got, ",") != "claim" {
		t.Errorf("without WithReadFirst a new key sent %v, want [claim]", got)
	}
	s := newStore(t, admin, traced, WithReadFirst())
	ctx := t.Context()
	req := func(id store.ID, fp string) store.ClaimRequest {
		return store.ClaimRequest{ID: id, Fingerprint: fingerprint(fp), Lease: time.Minute, Retention: time.Hour}
	}
	age := func(id store.ID, column string) { // puts the record's expiry or lease in the past
		if _, err := admin.Exec(ctx, `UPDATE `+s.Table()+` SET `+column+` = now() - interval '1 second' WHERE scope = $1 AND key = $2`,
			[]byte(id.Scope), []byte(id.Key)); err != nil {
			t.Fatal(err)
		}
	}
	done, held := newID(), newID()
	claim := func(name string, r store.ClaimRequest, want store.Outcome, takeover bool, statements ...string) store.ClaimResult {
		t.Helper()
		tracer.take()
		res, err := s.Claim(ctx, r)
		if err != nil || res.Outcome != want || res.Takeover != takeover {
			t.Fatalf("%s: Claim = %+v, %v; want %v (takeover %v)", name, res, err, want, takeover)
		}
		if got := tracer.take(); strings.Join(got, ",") != strings.Join(statements, ",") {
			t.Errorf("%s sent %v, want %v", name, got, statements)
		}
		return res
	}

	first := claim("new key", req(done, "a"), store.Claimed, false, "read", "claim")
	if err := s.Complete(ctx, done, first.Token, store.Response{Status: 201, Body: []byte("x")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if res := claim("replay", req(done, "a"), store.Completed, false, "read"); string(res.Record.Response.Body) != "x" ||
		res.Record.CreatedAt.IsZero() || res.Record.ExpiresAt.Before(res.Record.CompletedAt) {
		t.Fatalf("replay: record %+v", res.Record)
	}
	claim("mismatch", req(done, "b"), store.Mismatch, false, "read")
	claim("new key, held", req(held, "a"), store.Claimed, false, "read", "claim")
	if res := claim("in-flight duplicate", req(held, "a"), store.InFlight, false, "read"); res.RetryAfter <= 0 || res.RetryAfter > time.Minute {
		t.Fatalf("in flight: retry after %v", res.RetryAfter)
	}
	age(held, "lease_until")
	claim("lapsed lease, other fingerprint", req(held, "b"), store.Mismatch, false, "read")
	claim("lapsed lease", req(held, "a"), store.Claimed, true, "read", "claim")
	age(done, "expires_at")
	claim("expired record", req(done, "b"), store.Claimed, false, "read", "claim")
}

// TestKeyRowJudge: the claim's tests on a read row, judged in Go at the row's
// now, give what claimSQL computes: the lease's time left in whole
// milliseconds rounded up (toward zero below it), the answer's headers and
// body only for the same fingerprint, and a takeover for a record past its
// retention or a lapsed lease of the same fingerprint.
func TestKeyRowJudge(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	ts := func(d time.Duration) pgtype.Timestamptz { return pgtype.Timestamptz{Time: now.Add(d), Valid: true} }
	fp := fingerprint("a")
	inFlight := func(lease time.Duration, f store.Fingerprint) keyRow {
		return keyRow{fingerprint: f[:], created: ts(-time.Minute), expires: ts(time.Hour), lease: ts(lease), now: now}
	}
	for _, c := range []struct {
		name    string
		row     keyRow
		retryMS int64
		stale   bool
	}{
		{"lease left 1.5ms", inFlight(1500*time.Microsecond, fp), 2, false},
		{"lease left 2ms", inFlight(2*time.Millisecond, fp), 2, false},
		{"lease lapsed 1.5ms ago", inFlight(-1500*time.Microsecond, fp), -1, true},
		{"lease ends now", inFlight(0, fp), 0, true},
		{"lease lapsed, other fingerprint", inFlight(-time.Second, fingerprint("b")), -1000, false},
	} {
		r := c.row.judge(fp)
		if !r.retryMS.Valid || r.retryMS.Int64 != c.retryMS || r.stale != c.stale {
			t.Errorf("%s: retry %v ms, stale %v; want %d, %v", c.name, r.retryMS, r.stale, c.retryMS, c.stale)
		}
	}
	done := keyRow{fingerprint: fp[:], status: pgtype.Int2{Int16: 201, Valid: true}, headers: []byte("h"), body: []byte("b"),
		created: ts(-time.Minute), completed: ts(-time.Second), expires: ts(time.Hour), now: now}
	if r := done.judge(fp); !r.sameFP || string(r.headers) != "h" || string(r.body) != "b" || r.stale || r.retryMS.Valid {
		t.Errorf("completed, same fingerprint: %+v", r)
	}
	if r := done.judge(fingerprint("b")); r.sameFP || r.headers != nil || r.body != nil || r.stale {
		t.Errorf("completed, other fingerprint: %+v; want no headers or body", r)
	}
	done.expires = ts(0)
	if r := done.judge(fingerprint("b")); !r.stale {
		t.Errorf("past its retention: %+v; want a takeover", r)
	}
}

// TestOneTxReadsFirst: the one-transaction mode honours WithReadFirst: a
// replay or a mismatch of a completed key is one round trip, one statement,
// the primary-key read, and no transaction (no BEGIN, no ROLLBACK); a first
// execution pays that read, then claims in its transaction as without it.
func TestOneTxReadsFirst(t *testing.T) {
	tracer := &trafficTracer{}
	admin := newPool(t, "")
	traced := newPool(t, "", func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer; c.MaxConns = 1 })
	s := newStore(t, admin, traced, WithReadFirst())
	ts, err := s.OneTx(traced)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	texts := func() []string {
		tracer.mu.Lock()
		defer tracer.mu.Unlock()
		var got []string
		for sql := range tracer.texts {
			got = append(got, strings.Fields(strings.ToLower(sql))[0])
		}
		tracer.texts = nil
		return got
	}
	req := func(fp string) store.ClaimRequest {
		return store.ClaimRequest{ID: store.ID{Scope: "s", Key: "k"}, Fingerprint: fingerprint(fp), Lease: time.Minute, Retention: time.Hour}
	}
	tracer.take()
	texts()
	res, tx, err := ts.ClaimTx(ctx, req("a"))
	if err != nil || res.Outcome != store.Claimed || tx == nil {
		t.Fatalf("first: %+v, %v, %v", res, tx, err)
	}
	if end, err := tx.Commit(ctx, store.Response{Status: 201, Body: []byte("x")}, time.Hour); err != nil || end != claim.TxCommitted {
		t.Fatalf("commit: %v, %v", end, err)
	}
	trips, _, commits := tracer.take()
	if got := texts(); trips != 3 || commits != 1 || !slices.Contains(got, "begin") {
		t.Fatalf("first execution: %d round trips, %d commits, %v; want the read, the claim's batch (begin ...), the record's", trips, commits, got)
	}
	for _, c := range []struct {
		fp   string
		want store.Outcome
	}{{"a", store.Completed}, {"b", store.Mismatch}} {
		res, tx, err := ts.ClaimTx(ctx, req(c.fp))
		if err != nil || res.Outcome != c.want || tx != nil {
			t.Fatalf("%v: %+v, %v, %v", c.want, res, tx, err)
		}
		if c.want == store.Completed && string(res.Record.Response.Body) != "x" {
			t.Fatalf("replay: %+v", res.Record)
		}
		// A transaction's ROLLBACK would run in the background: take the pool's
		// one connection so that it is counted.
		conn, err := traced.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conn.Release()
		trips, stmts, commits := tracer.take()
		if got := texts(); trips != 1 || stmts != 1 || commits != 0 || len(got) != 1 || got[0] != "select" {
			t.Fatalf("%v: %d round trips, %d statements, %d commits, %v; want one plain SELECT", c.want, trips, stmts, commits, got)
		}
	}
}
