package postgres

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
)

// scansOf returns the actual loops of every scan of table in an EXPLAIN
// (ANALYZE, FORMAT JSON) plan.
func scansOf(plan any, table string) (loops []float64) {
	switch p := plan.(type) {
	case []any:
		for _, x := range p {
			loops = append(loops, scansOf(x, table)...)
		}
	case map[string]any:
		name, _ := p["Relation Name"].(string)
		node, _ := p["Node Type"].(string)
		if strings.HasSuffix(node, "Scan") && name != "" &&
			strings.Contains(table, `"`+name+`"`) {
			l, _ := p["Actual Loops"].(float64)
			loops = append(loops, l)
		}
		for k, v := range p {
			if k == "Plan" || k == "Plans" {
				loops = append(loops, scansOf(v, table)...)
			}
		}
	}
	return loops
}

// TestOneTxWritesRecordOnce: a first execution on a one-transaction route
// writes its record once, with the response: the row of a fresh table is the
// first version of its first slot, (0,1), never updated (an insert then an
// update leaves it at (0,2)).
func TestOneTxWritesRecordOnce(t *testing.T) {
	e := newOneTxEnv(t, nil, insertInTx, nil)
	if code, _, _, err := e.post("once"); err != nil || code != 201 {
		t.Fatal(code, err)
	}
	var ctid string
	var status int
	if err := e.pool.QueryRow(t.Context(), `SELECT ctid::text, status FROM `+e.st.Table()).Scan(&ctid, &status); err != nil {
		t.Fatal(err)
	}
	if ctid != "(0,1)" || status != 201 {
		t.Fatalf("record at %s, status %d; want (0,1) (written once), 201", ctid, status)
	}
}

// TestOneTxOrdinaryClaimMeanwhile: a claim of the ordinary mode does not take
// the key's lock, so it can claim a key while a one-transaction request runs
// under it; then the one-transaction completion's insert fails on the key,
// its transaction (the handler's row) rolls back and its client gets 503, and
// the ordinary claim's record is the one that stays.
func TestOneTxOrdinaryClaimMeanwhile(t *testing.T) {
	entered, proceed := make(chan struct{}), make(chan struct{})
	e := newOneTxEnv(t, nil, heldInsert(entered, proceed), nil)
	done := make(chan int, 1)
	go func() {
		code, _, _, err := e.post("mixed")
		if err != nil {
			t.Error(err)
		}
		done <- code
	}()
	<-entered
	id := store.ID{Scope: "", Key: "mixed"}
	req := store.ClaimRequest{ID: id, Fingerprint: fingerprint("other"), Lease: time.Minute, Retention: time.Hour}
	res, err := e.st.Claim(t.Context(), req)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("ordinary claim during the route's request: %+v %v", res, err)
	}
	if err := e.st.Complete(t.Context(), id, res.Token, store.Response{Status: 200, Body: []byte("ordinary")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	if code := <-done; code != 503 {
		t.Fatalf("the one-transaction request answered %d; want 503", code)
	}
	if rows, _, records := e.counts(); rows != 0 || records != 1 {
		t.Fatalf("%d handler rows, %d records; want 0 (rolled back) and 1 (the ordinary claim's)", rows, records)
	}
}

// heldStatementTracer blocks the statement leakSQL until release is closed, and
// records whether a batch began while it was blocked.
type heldStatementTracer struct {
	entered, release chan struct{}
	once             sync.Once
	held, overlapped atomic.Bool
}

// leakSQL is true in a transaction begun before it (the request's), NULL alone.
const leakSQL = "SELECT nullif(now() < statement_timestamp(), false)"

func (h *heldStatementTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == leakSQL {
		h.held.Store(true)
		close(h.entered)
		<-h.release
		h.held.Store(false)
	}
	return ctx
}
func (h *heldStatementTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (h *heldStatementTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	if h.held.Load() {
		h.overlapped.Store(true)
		h.once.Do(func() { close(h.release) })
	}
	return ctx
}
func (h *heldStatementTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (h *heldStatementTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestOneTxStatementDuringComplete: a statement of the handler's Tx that has
// passed its check when the middleware completes (a goroutine the handler did
// not wait for) runs in the request's transaction, before its commit; it used
// to run on the connection after the commit, outside any transaction. (If
// Complete did wait, nothing else releases the statement: a fallback timer
// does, and the test passes whatever its timing.)
func TestOneTxStatementDuringComplete(t *testing.T) {
	h := &heldStatementTracer{entered: make(chan struct{}), release: make(chan struct{})}
	pool := newPool(t, "", func(c *pgxpool.Config) { c.ConnConfig.Tracer = h; c.MaxConns = 4 })
	var txid *bool
	var leakErr error
	leaked := make(chan struct{})
	e := newOneTxEnv(t, pool, func(e *oneTxEnv) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			tx, ok := TxFromContext(r.Context())
			if !ok {
				t.Error("no transaction")
				return
			}
			go func() {
				defer close(leaked)
				leakErr = tx.QueryRow(context.Background(), leakSQL).Scan(&txid)
			}()
			<-h.entered
			w.WriteHeader(201)
		}
	}, nil)
	timer := time.AfterFunc(300*time.Millisecond, func() { h.once.Do(func() { close(h.release) }) })
	defer timer.Stop()
	if code, _, _, err := e.post("leak"); err != nil || code != 201 {
		t.Fatal(code, err)
	}
	<-leaked
	if h.overlapped.Load() {
		t.Fatal("the completion was sent while a statement of the handler's was under way")
	}
	if leakErr != nil || txid == nil {
		t.Fatalf("the handler's statement: txid %v, err %v; want it run in the request's transaction", txid, leakErr)
	}
}
