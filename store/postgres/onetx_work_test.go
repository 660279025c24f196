package postgres

import (
	"context"
	"encoding/json"
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

// TestOneTxFirstClaimReadsNothing: the first claim of a new key on a
// one-transaction route is the insert alone, the read of the row in its way
// is planned but never runs; for an existing record the same statement reads
// it (one scan) and answers it.
func TestOneTxFirstClaimReadsNothing(t *testing.T) {
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	ts, err := s.OneTx(pool)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	req := store.ClaimRequest{ID: newID(), Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
	explain := func() []float64 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		var out string
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+ts.firstSQL, claimArgs(req, store.NewToken())...).Scan(&out); err != nil {
			t.Fatal(err)
		}
		var plan any
		if err := json.Unmarshal([]byte(out), &plan); err != nil {
			t.Fatal(err)
		}
		return scansOf(plan, s.Table())
	}
	if loops := explain(); len(loops) != 1 || loops[0] != 0 {
		t.Fatalf("new key: scans of the records table ran %v times; want one scan planned, never run", loops)
	}
	res, err := s.Claim(ctx, req)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatal(res, err)
	}
	if err := s.Complete(ctx, req.ID, res.Token, store.Response{Status: 201, Body: []byte("ok")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if loops := explain(); len(loops) != 1 || loops[0] != 1 {
		t.Fatalf("completed record: scans %v; want one, run once", loops)
	}
	got, err := ts.Claim(context.WithValue(ctx, txKey{}, &txSlot{}), req)
	if err != nil || got.Outcome != store.Completed || got.Record == nil || string(got.Record.Body) != "ok" {
		t.Fatalf("replay on a route: %+v %v", got, err)
	}
}

// heldStatementTracer blocks the statement leakSQL until release is closed, and
// records whether a batch began while it was blocked.
type heldStatementTracer struct {
	entered, release chan struct{}
	once             sync.Once
	held, overlapped atomic.Bool
}

const leakSQL = "SELECT txid_current_if_assigned()"

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
	var txid *int64
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
