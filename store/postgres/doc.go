// Package postgres is the authoritative idempotency store on PostgreSQL (pgx/v5):
// every transition of the store contract (package store, docs/architecture.md section 4) is
// one SQL statement and one round trip (with WithReadFirst a claim that writes is
// two, a read and the claim statement), and lease deadlines and retention run on
// the server's clock (now()), never the application's.
//
// # Use
//
//	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	st, err := postgres.New(pool, postgres.WithTable("idemkey_records"))
//	err = st.Migrate(ctx)                        // once at startup; idempotent
//	stop := st.StartSweeper(ctx, time.Minute)    // optional: delete expired rows
//	defer stop()
//	defer st.StopWaiters()                       // after the last request
//	m, err := middleware.New(st, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
//	err = http.ListenAndServe(addr, m.Handler(mux))
//
// Every error must be checked; README.md's Postgres program
// (store/postgres/internal/quickstart) is the complete version.
// New accepts any Querier (Exec and QueryRow): *pgxpool.Pool, *pgx.Conn or a
// pgx.Tx the caller owns. Statements go through pgx's statement cache (prepared once
// per connection); there are no explicit transactions on the hot path.
//
// # Retention at scale
//
// WithPartitions(epoch) selects the partitioned layout: records live in a table
// partitioned by the epoch of their claim, the claim is a function that keeps
// (scope, key) unique under an advisory lock, and Sweep drops whole partitions
// once all their records have expired (DETACH PARTITION CONCURRENTLY, DROP
// TABLE), at a cost that does not grow with the rows removed. The plain table is
// the default; docs/stores.md section 3.5.1 has the bound on retention.
//
// # Table
//
// Migrate creates (names configurable with WithTable and WithSchema; every name is
// quoted with pgx.Identifier):
//
//	idemkey_records
//	  scope        bytea       NOT NULL   principal or tenant (any bytes)
//	  key          bytea       NOT NULL   Idempotency-Key (any bytes)
//	  fingerprint  bytea       NOT NULL   SHA-256 of the request, 32 bytes
//	  token        bytea       NOT NULL   fencing token of the current holder, 16 bytes
//	  lease_until  timestamptz            lease deadline; NULL once completed
//	  status       smallint               HTTP status; NULL while in flight
//	  headers      bytea                  replayable headers, encoding below; NULL if none
//	  body         bytea                  exact body bytes; NULL if empty or omitted
//	  body_omitted boolean     NOT NULL   body was over the middleware's cap
//	  created_at   timestamptz NOT NULL   first claim (kept by a takeover)
//	  completed_at timestamptz            NULL while in flight
//	  expires_at   timestamptz NOT NULL   retention deadline; the key is new again after it
//	  PRIMARY KEY (scope, key)
//	idemkey_records_expires_at_idx ON (expires_at)   for Sweep
//	idemkey_records_migrations (version, applied_at) Migrate's bookkeeping
//
// Scope and key are bytea, not text, because they may hold any bytes and Postgres
// text refuses NUL; an ID over the limits every store enforces (store.MaxScopeLen,
// store.MaxKeyLen) is refused with store.ErrInvalid before any I/O; those
// limits keep every ID within what the btree index accepts. The SQL lives in the embedded files migrations/NNNN_*.sql;
// MigrationSQL returns it rendered for the configured names, for users of their
// own migration tool.
//
// Headers are stored in the compact binary form that store/redis keeps too (one
// implementation for both): a format byte (1), then uvarint counts and lengths: number of names; per name its length and bytes, number of
// values, and each value's length and bytes. A row that does not decode (unknown
// format, truncated data, a status outside 100-999, a body over WithMaxBody, a body
// next to the omitted mark) makes Claim return store.ErrCorrupt, never a panic.
// Leases and retentions are sent in whole milliseconds, rounded up, like every
// store's (see store.ClaimRequest).
//
// # Claim: one statement, or a read first
//
// With WithReadFirst, Claim first reads the key's row by primary key (no lock,
// no write) and answers from it when the row decides the request: Completed (a
// replay), Mismatch or InFlight; only a new key, a record past its retention or
// a lapsed lease goes on to the claim statement. By default Claim sends the
// claim statement alone, the one that writes: a CTE reads the row, and only
// when there is none or it may be taken does an INSERT ... ON CONFLICT (scope,
// key) DO UPDATE ... WHERE run, re-checking the takeover on the newest row
// version:
//
//   - no row: insert with a lease of now()+lease and retention now()+retention;
//   - a row past its retention: replaced, whatever its fingerprint (a new key);
//   - an uncompleted row whose lease expired, same fingerprint: taken over with a
//     new token (ClaimResult.Takeover);
//   - otherwise the row is returned as read, and Claim answers Mismatch (other
//     fingerprint), Completed (with the record) or InFlight (with the remaining
//     lease, computed by the server, rounded up to the millisecond).
//
// Replays, in-flight duplicates and mismatches are therefore one round trip that
// locks nothing and writes no WAL (an ON CONFLICT DO UPDATE whose WHERE fails
// still locks the row; the CTE keeps the statement from reaching it).
//
// Under READ COMMITTED, when a concurrent claim commits the same key after this
// statement's snapshot, the INSERT sees the conflict but the read in the same
// statement cannot see the row, so the statement returns nothing (docs/stores.md
// section 3.3). Claim detects it (and the related case of a stale snapshot row) and
// re-runs the statement, so every call ends with a definite answer or an error.
//
// # Completion in the handler's transaction
//
// A handler whose side effect lives in the same database (a charge row, an order)
// completes the idempotency record in its own transaction, so the row and the
// record commit together (docs/architecture.md section 9): a crash before the
// commit leaves neither (the retry runs once, after the lease), a crash after it
// leaves both (the retry replays). CompleteTx is the token-fenced UPDATE in the
// caller's pgx.Tx; CommitResponse does the common case in one call:
//
//	tx, err := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	... tx.Exec(ctx, `INSERT INTO charges ...`)
//	err = st.CommitResponse(ctx, tx, w, store.Response{Status: 201, Header: h, Body: body})
//	// store.ErrLeaseLost: a retry took the key over; the charge rolled back: answer 409
//	// ErrCommitUnknown or another error: answer 5xx (the middleware releases, fenced)
//
// The fence is the token: when the lease expired and a retry took the key over, the
// stale holder's UPDATE matches no row, CompleteTx returns store.ErrLeaseLost and the
// handler rolls back, so its side effect never commits. One statement inside the
// handler's commit, no round trip after it (the middleware does not call Complete).
//
// # Behind PgBouncer
//
// In transaction pooling mode PgBouncer gives each transaction whichever server
// connection is free, so prepared statements and LISTEN do not survive from one
// statement to the next. WithTransactionPooler sends every statement with
// pgx.QueryExecModeExec (one round trip, nothing prepared) and makes Wait poll
// the key's row with back-off (WithPolledWait) instead of listening. The store
// does not probe for a pooler: one built without the option answers a
// statement-cache error (SQLSTATE 26000 or 42P05; the statement did not run)
// with ErrTransactionPooler, which names the option. CompleteTx runs in the caller's
// transaction, pinned to one server connection until it ends, as on a direct
// connection.
//
// # One transaction per route
//
// Store.OneTx returns the store's one-transaction mode (TxStore), for handlers
// that only touch this database: a claim.TxStore, so on a route the middleware
// runs in this mode (middleware.Middleware.OneTx; idem.Runner.DoTx per call) the claim
// (BEGIN, the key's advisory lock tried, and the read of its record in one pgx
// batch; when another transaction holds the lock, a wait for it bounded by a
// local lock_timeout and the read again), the handler's statements in the transaction of
// TxFromContext, and the completion (the record's insert, fenced on the server) with the COMMIT (a
// second batch) make one transaction and one commit. A duplicate waits on the
// key's lock up to WithLockWait, then replays or gets 409; a crash aborts the
// transaction and frees the key; an answer the middleware releases for (5xx,
// ...) rolls everything back. The route holds a connection and the key's lock
// for the handler's duration (docs/architecture.md
// section 9.1). Other routes on the same TxStore run in the default mode.
//
// # Operators
//
// Inspect and Evict (store.Inspector) are one statement each. Inspect is a plain
// SELECT with the server's now(): no lock, no write. Evict locks the key's row
// (SELECT ... FOR UPDATE, so under READ COMMITTED it waits for a concurrent claim or
// completion and reads the row as committed), judges it against the
// store.EvictPolicy and deletes it in the same statement: a claim taken over while
// Evict waited is live again and is not removed as abandoned.
//
// # Errors and failures
//
// Complete, Release and Renew are one token-guarded UPDATE or DELETE each; zero
// rows means store.ErrLeaseLost. Every other error (connection loss, pool
// exhaustion, statement timeout, cancellation) is the driver's error wrapped, which
// the middleware answers with 503. pgxpool waits for a free connection until the
// context is done, so give requests a deadline for exhaustion to surface. A claim whose answer is lost (cancelled context,
// dropped connection) may have been committed; it then blocks its key only until
// its lease expires, after which the same request takes it over.
package postgres
