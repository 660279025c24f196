package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	pgstore "github.com/idemkey/idemkey/store/postgres"
)

const (
	ordersTable  = "writepath_orders"
	recordsTable = "writepath_records"
	insertSQL    = `INSERT INTO ` + ordersTable + ` (key, amount) VALUES ($1, $2) RETURNING id`
)

// setup creates the benchmark's tables (the orders, the store's records) and
// empties them.
func setup(ctx context.Context, pool *pgxpool.Pool, st *pgstore.Store) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+ordersTable+` (
    id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `TRUNCATE `+ordersTable+`, `+st.Table())
	return err
}

// insertOrder inserts the request's row in q and returns the answer.
func insertOrder(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, key string) (store.Response, error) {
	var id int64
	if err := q.QueryRow(ctx, insertSQL, key, 100).Scan(&id); err != nil {
		return store.Response{}, err
	}
	body := []byte(`{"id":` + strconv.FormatInt(id, 10) + `,"key":` + strconv.Quote(key) + `,"amount":100}`)
	return store.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}, nil
}

func write(w http.ResponseWriter, resp store.Response) {
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.Status)
	w.Write(resp.Body)
}

// ownTx is the handler alone: its row in its own transaction (begin, insert,
// commit), answered 201.
func ownTx(pool *pgxpool.Pool) http.HandlerFunc {
	return inOwnTx(pool, func(ctx context.Context, tx pgx.Tx, w http.ResponseWriter, resp store.Response) error {
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		write(w, resp)
		return nil
	})
}

// commitResponse is ownTx completing the record in its transaction.
func commitResponse(pool *pgxpool.Pool, st *pgstore.Store) http.HandlerFunc {
	return inOwnTx(pool, func(ctx context.Context, tx pgx.Tx, w http.ResponseWriter, resp store.Response) error {
		return st.CommitResponse(ctx, tx, w, resp)
	})
}

// inOwnTx begins a transaction, inserts the request's row in it and hands the
// answer to finish, which commits and answers; a failure answers 5xx.
func inOwnTx(pool *pgxpool.Pool, finish func(context.Context, pgx.Tx, http.ResponseWriter, store.Response) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := pool.Begin(ctx)
		if err != nil {
			http.Error(w, err.Error(), 503)
			return
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		resp, err := insertOrder(ctx, tx, r.Header.Get("Idempotency-Key"))
		if err == nil {
			err = finish(ctx, tx, w, resp)
		}
		if err != nil {
			http.Error(w, err.Error(), 500)
		}
	}
}

// recordSQL writes a row of the store's shape, as the one-transaction
// completion does (the store's recordSQL), for the record mode.
const recordSQL = `INSERT INTO ` + recordsTable + ` (scope, key, fingerprint, token, status, headers, body, body_omitted,
    created_at, completed_at, expires_at)
VALUES ($1, $2, $9, $3, $4, $5, $6, $7, now(), now(), now() + $8::bigint * interval '1 millisecond')`

// recordOnly is the handler alone with one row in the store's table written in
// its transaction, pipelined with the COMMIT: BEGIN, the handler's insert, then
// the row and COMMIT in one batch (three round trips, four statements). No
// middleware, no claim, no lock, no read: the least any design that writes the
// record in the handler's transaction adds to none.
func recordOnly(pool *pgxpool.Pool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			http.Error(w, err.Error(), 503)
			return
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, "begin"); err != nil {
			http.Error(w, err.Error(), 503)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		orderAndRecord(ctx, w, conn, key)
	}
}

// readSQL is the primary-key read of the key's record, as the store's (rowSQL).
const readSQL = `SELECT fingerprint, status, headers, body, body_omitted, created_at, completed_at, expires_at, lease_until, now()
FROM ` + recordsTable + ` WHERE scope = $1 AND key = $2`

// decideOnly is recordOnly plus the least a decision before the handler costs
// the database: the primary-key read of the key's record (one index probe; no
// row for a new key), pipelined with the BEGIN whose round trip record pays
// anyway (BEGIN and the read, the handler's insert, the row and COMMIT: three
// round trips, five statements). No lock, no mark, no fence, no middleware.
func decideOnly(pool *pgxpool.Pool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			http.Error(w, err.Error(), 503)
			return
		}
		defer conn.Release()
		key := r.Header.Get("Idempotency-Key")
		b := &pgx.Batch{}
		b.Queue("begin")
		found := false
		b.Queue(readSQL, []byte{}, []byte(key)).QueryRow(func(row pgx.Row) error {
			var fp, headers, body []byte
			var status pgtype.Int2
			var omitted bool
			var created, completed, expires, lease pgtype.Timestamptz
			var now time.Time
			err := row.Scan(&fp, &status, &headers, &body, &omitted, &created, &completed, &expires, &lease, &now)
			if found = err == nil; errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
		if err := conn.SendBatch(ctx, b).Close(); err != nil || found {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "rollback")
			http.Error(w, fmt.Sprint("decide: ", found, err), 500)
			return
		}
		orderAndRecord(ctx, w, conn, key)
	}
}

// orderAndRecord runs the handler's insert, then the record's row and COMMIT,
// in the transaction conn has open; any error rolls back and answers 500.
func orderAndRecord(ctx context.Context, w http.ResponseWriter, conn *pgxpool.Conn, key string) {
	resp, err := insertOrder(ctx, conn, key)
	if err == nil {
		err = recordAndCommit(ctx, conn, key, resp)
	}
	if err != nil {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "rollback")
		http.Error(w, err.Error(), 500)
		return
	}
	write(w, resp)
}

// recordAndCommit sends the record's row and COMMIT in one batch.
func recordAndCommit(ctx context.Context, conn *pgxpool.Conn, key string, resp store.Response) error {
	b := &pgx.Batch{}
	b.Queue(recordSQL, []byte{}, []byte(key), make([]byte, 16), int16(resp.Status),
		[]byte("\x0cContent-Type\x10application/json"), resp.Body, false, int64(24*time.Hour/time.Millisecond), make([]byte, 32))
	b.Queue("COMMIT")
	return conn.SendBatch(ctx, b).Close()
}

// inTx is the one-transaction handler: its row in the request's transaction.
func inTx(w http.ResponseWriter, r *http.Request) {
	tx, ok := pgstore.TxFromContext(r.Context())
	if !ok {
		http.Error(w, "no transaction", 500)
		return
	}
	resp, err := insertOrder(r.Context(), tx, r.Header.Get("Idempotency-Key"))
	if err != nil {
		http.Error(w, err.Error(), 500)
		return
	}
	write(w, resp)
}

// handler returns the server's handler for mode.
func handler(mode string, pool *pgxpool.Pool, st *pgstore.Store) (http.Handler, error) {
	quiet := middleware.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	switch mode {
	case "none":
		return ownTx(pool), nil
	case "record":
		return recordOnly(pool), nil
	case "decide":
		return decideOnly(pool), nil
	case "decidemw":
		mw, err := middleware.New(memory.New(), middleware.GlobalScope, quiet, middleware.WithWaitInFlight(waitBound))
		if err != nil {
			return nil, err
		}
		return mw.Handler(decideOnly(pool)), nil
	case "ordinary", "commit":
		mw, err := middleware.New(st, middleware.GlobalScope, quiet, middleware.WithWaitInFlight(waitBound))
		if err != nil {
			return nil, err
		}
		if mode == "commit" {
			return mw.Handler(commitResponse(pool, st)), nil
		}
		return mw.Handler(ownTx(pool)), nil
	case "onetx", "onetxread":
		if mode == "onetxread" { // the store's WithReadFirst: a replay is one read, a first execution one more
			var err error
			if st, err = pgstore.New(pool, pgstore.WithTable(recordsTable), pgstore.WithReadFirst()); err != nil {
				return nil, err
			}
		}
		ts, err := st.OneTx(pool, pgstore.WithLockWait(waitBound))
		if err != nil {
			return nil, err
		}
		mw, err := middleware.New(ts, middleware.GlobalScope, quiet, middleware.WithWaitInFlight(waitBound))
		if err != nil {
			return nil, err
		}
		return mw.OneTx(http.HandlerFunc(inTx)), nil
	}
	return nil, fmt.Errorf("unknown mode %q (%s)", mode, strings.Join(allModes, ", "))
}

// tally sums the counts of first executions (2xx, not replayed) and counts
// the other answers.
type tally struct {
	firsts, replays, others       atomic.Int64
	trips, statements, commits    atomic.Int64
	replayTrips, replayStatements atomic.Int64
}

// counted wraps h: each request carries its counts, added to t by its answer.
func counted(h http.Handler, t *tally) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c counts
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r.WithContext(withCounts(r.Context(), &c)))
		switch {
		case sw.code >= 200 && sw.code < 300 && w.Header().Get("Idempotent-Replayed") == "":
			t.firsts.Add(1)
			t.trips.Add(c.trips.Load())
			t.statements.Add(c.statements.Load())
			t.commits.Add(c.commits.Load())
		case sw.code >= 200 && sw.code < 300:
			t.replays.Add(1)
			t.replayTrips.Add(c.trips.Load())
			t.replayStatements.Add(c.statements.Load())
		default:
			t.others.Add(1)
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}
