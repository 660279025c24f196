package postgres

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/policy"
	"github.com/idemkey/idemkey/store"
)

// TestOneTxSavepointAfterReturn: a savepoint the handler opened (Begin on the
// request's transaction) and keeps past its return refuses statements with
// pgx.ErrTxClosed, as the transaction itself does, instead of running them on
// the pooled connection the transaction committed on (there each statement
// would commit on its own, outside every idempotency record); inside the
// handler the savepoint works, and its Commit releases it.
func TestOneTxSavepointAfterReturn(t *testing.T) {
	kept := make(chan pgx.Tx, 1)
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		inner := insertInTx(e)
		return func(w http.ResponseWriter, r *http.Request) {
			tx, _ := TxFromContext(r.Context())
			sp, err := tx.Begin(r.Context())
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			if _, err := sp.Exec(r.Context(), `INSERT INTO `+e.side+` (key) VALUES ('in-savepoint')`); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			if err := sp.Commit(r.Context()); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			if sp, err = tx.Begin(r.Context()); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			kept <- sp
			inner(w, r)
		}
	}, nil)
	if code, _, body, err := e.post("sp-1"); err != nil || code != 201 {
		t.Fatalf("first: %d %q %v", code, body, err)
	}
	sp := <-kept
	// The pool of 20 gives the committed connection back on the next Acquire.
	if _, err := sp.Exec(t.Context(), `INSERT INTO `+e.side+` (key) VALUES ('after-return')`); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("savepoint Exec after the handler returned = %v, want pgx.ErrTxClosed", err)
	}
	if err := sp.Rollback(t.Context()); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("savepoint Rollback after the handler returned = %v, want pgx.ErrTxClosed", err)
	}
	if rows, _, records := e.counts(); rows != 2 || records != 1 {
		t.Fatalf("%d rows, %d records; want 2 rows (the savepoint's and the handler's) and 1 record", rows, records)
	}
}

// TestOneTxEndedBySQL: a handler cannot end the request's transaction with SQL
// of its own (ROLLBACK): the statement is refused with ErrTxOwned, not sent;
// the handler answers 500, which releases the key, and its retry runs once, in
// a transaction: one row, one record.
func TestOneTxEndedBySQL(t *testing.T) {
	first := true
	var stray error
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		inner := insertInTx(e)
		return func(w http.ResponseWriter, r *http.Request) {
			if first { // requests of this test are sequential
				first = false
				tx, _ := TxFromContext(r.Context())
				if _, stray = tx.Exec(r.Context(), "ROLLBACK"); stray != nil {
					http.Error(w, stray.Error(), 500)
					return
				}
			}
			inner(w, r)
		}
	}, nil)
	if code, _, body, err := e.post("sql-1"); err != nil || code != 500 {
		t.Fatalf("first: %d %q %v; want the handler's 500", code, body, err)
	}
	if !errors.Is(stray, ErrTxOwned) {
		t.Errorf("the handler's ROLLBACK = %v, want ErrTxOwned (not sent)", stray)
	}
	if code, _, body, err := e.post("sql-1"); err != nil || code != 201 {
		t.Fatalf("retry: %d %q %v; want 201", code, body, err)
	}
	if rows, _, records := e.counts(); rows != 1 || records != 1 {
		t.Fatalf("%d rows, %d records; want 1 and 1", rows, records)
	}
}

// TestOneTxLockWaitWithinClaimTimeout: a lock wait longer than the middleware's
// claim timeout is cut to half the claim's time, so a duplicate of a request in
// flight is answered 409 request_in_flight when it runs out, not 503 (the claim's
// deadline, counted as a store outage).
func TestOneTxLockWaitWithinClaimTimeout(t *testing.T) {
	entered, proceed := make(chan struct{}, 1), make(chan struct{})
	e := newOneTxEnv(t, nil, heldInsert(entered, proceed), []TxOption{WithLockWait(20 * time.Second)},
		middleware.WithStoreFailure(policy.StoreFailureRule{Timeouts: claim.Timeouts{Claim: 4 * time.Second}}))
	release := sync.OnceFunc(func() { close(proceed) })
	t.Cleanup(release) // before the server closes, should the test fail first
	first := make(chan int, 1)
	go func() {
		code, _, _, _ := e.post("bound-1")
		first <- code
	}()
	<-entered
	code, h, body, err := e.post("bound-1")
	if err != nil || code != http.StatusConflict || h.Get("Retry-After") == "" {
		t.Errorf("duplicate: %d %q Retry-After=%q %v; want 409 request_in_flight", code, body, h.Get("Retry-After"), err)
	}
	release()
	if c := <-first; c != 201 {
		t.Fatalf("first: %d, want 201", c)
	}
}

// heldInsert is insertInTx that first says it entered and waits for proceed to
// be closed.
func heldInsert(entered chan<- struct{}, proceed <-chan struct{}) func(*oneTxEnv) http.HandlerFunc {
	return func(e *oneTxEnv) http.HandlerFunc {
		inner := insertInTx(e)
		return func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-proceed
			inner(w, r)
		}
	}
}

// TestKeyLockIsFNV1a: the key's lock is FNV-1a (64 bits) of the table's quoted
// name, a zero byte, the scope's length (8 bytes big endian), the scope and
// the key, as every earlier build computed it, so a claim waits for a holder
// running another build.
func TestKeyLockIsFNV1a(t *testing.T) {
	ts := &TxStore{Store: &Store{qualified: `"s"."idemkey_records"`}}
	for _, id := range []store.ID{{Key: "k"}, {Scope: "tenant-1", Key: "order-17"}, {Scope: strings.Repeat("é", 300), Key: "x\x00y"}} {
		h := fnv.New64a()
		var n [9]byte
		binary.BigEndian.PutUint64(n[1:], uint64(len(id.Scope)))
		h.Write([]byte(ts.qualified))
		h.Write(n[:])
		h.Write([]byte(id.Scope + id.Key))
		if got, want := ts.keyLock(id), int64(h.Sum64()); got != want {
			t.Errorf("keyLock(%q, %q) = %d, want %d", id.Scope, id.Key, got, want)
		}
	}
	// A key every build since the mode's first must give (a rolling deploy's
	// old and new processes meet on it).
	if got := ts.keyLock(store.ID{Scope: "tenant-1", Key: "order-17"}); got != 2036135740106251232 {
		t.Errorf("keyLock(tenant-1, order-17) = %d, want 2036135740106251232", got)
	}
}

// TestCommitResponseRefusedInOneTx: CommitResponse inside a one-transaction
// route is refused with claim.ErrOneTx before it sends a statement, whichever
// transaction it is given (the route's, a savepoint of it, one of the pool's,
// which it rolls back) and whether the claim will insert the record or took an
// expired one over: nothing is written to the client, and the route commits
// the handler's own answer, which retries replay. It used to reach CompleteTx:
// ErrLeaseLost, or a wait on the row the route's claim had locked.
func TestCommitResponseRefusedInOneTx(t *testing.T) {
	errs := make(chan error, 1)
	e := newOneTxEnv(t, nil, func(e *oneTxEnv) http.HandlerFunc {
		inner := insertInTx(e)
		return func(w http.ResponseWriter, r *http.Request) {
			errs <- commitInOneTx(e, w, r)
			inner(w, r)
		}
	}, nil)
	for _, variant := range []string{"route", "savepoint", "pool"} {
		key := variant + "-refused"
		for _, takeover := range []bool{false, true} {
			if takeover {
				if _, err := e.pool.Exec(t.Context(), `UPDATE `+e.st.Table()+` SET expires_at = now() - interval '1 second' WHERE key = $1`, []byte(key)); err != nil {
					t.Fatal(err)
				}
			}
			code, _, body, err := e.post(key)
			if cerr := <-errs; !errors.Is(cerr, claim.ErrOneTx) {
				t.Errorf("%s, takeover %v: CommitResponse answered %v, want claim.ErrOneTx", variant, takeover, cerr)
			}
			if err != nil || code != 201 || strings.Contains(body, "CommitResponse") {
				t.Errorf("%s, takeover %v: %d %q %v; want the handler's own 201", variant, takeover, code, body, err)
			}
			code, h, again, err := e.post(key)
			if err != nil || code != 201 || again != body || h.Get("Idempotent-Replayed") == "" {
				t.Errorf("%s, takeover %v: retry %d %q replayed=%q %v; want %q replayed", variant, takeover, code, again, h.Get("Idempotent-Replayed"), err, body)
			}
		}
	}
	if rows, _, records := e.counts(); rows != 6 || records != 3 {
		t.Fatalf("%d rows, %d records; want 6 (the handler's own, none of the pool transactions') and 3", rows, records)
	}
}

// commitInOneTx calls CommitResponse in a one-transaction route with the
// transaction the key's first word names; a pool transaction holds a row of
// its own and must be rolled back after.
func commitInOneTx(e *oneTxEnv, w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	route, ok := TxFromContext(ctx)
	if !ok {
		return errors.New("no transaction")
	}
	id, _ := middleware.KeyFromContext(ctx)
	variant, _, _ := strings.Cut(id.Key, "-")
	tx, err := route, error(nil)
	switch variant {
	case "savepoint":
		tx, err = route.Begin(ctx)
	case "pool":
		if tx, err = e.pool.Begin(ctx); err == nil {
			_, err = tx.Exec(ctx, `INSERT INTO `+e.side+` (key) VALUES ('pool')`)
		}
	}
	if err != nil {
		return err
	}
	err = e.st.CommitResponse(ctx, tx, w, store.Response{Status: 200, Body: []byte("from CommitResponse")})
	if _, xerr := tx.Exec(ctx, `SELECT 1`); variant == "pool" && !errors.Is(xerr, pgx.ErrTxClosed) {
		return fmt.Errorf("the pool transaction was left open (%v); CommitResponse: %v", xerr, err)
	}
	return err
}
