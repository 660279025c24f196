// Package mysql is the authoritative idempotency store on MySQL 8 and MariaDB
// 10.11 (database/sql with github.com/go-sql-driver/mysql, InnoDB): every
// transition of the store contract (package store, docs/architecture.md section 4)
// is token-fenced, and lease deadlines and retention run on the server's clock
// (UTC_TIMESTAMP(6)), never the application's.
//
// # Use
//
//	db, err := sql.Open("mysql", os.Getenv("MYSQL_DSN")) // e.g. app@tcp(db:3306)/app
//	st, err := mysql.New(db, mysql.WithTable("idemkey_records"))
//	err = st.Migrate(ctx)                        // once at startup; idempotent
//	stop := st.StartSweeper(ctx, time.Minute)    // optional: delete expired rows
//	defer stop()
//	defer st.Close()                             // its prepared statements
//
// The store prepares each statement once (database/sql prepares it again on each
// connection at its first use there), so every call is one round trip whether or
// not the DSN sets interpolateParams. The pool must be in autocommit mode (the
// driver's default): each statement is then its own transaction and each read
// its own snapshot, under REPEATABLE READ (the default) as under READ COMMITTED.
// No DSN option is needed: times are read as microseconds since the epoch, so
// parseTime and loc do not matter, and no answer depends on clientFoundRows.
//
// # Table
//
// Migrate creates (the name is configurable with WithTable, quoted with
// backticks):
//
//	idemkey_records
//	  scope        VARBINARY(1024) NOT NULL   principal or tenant (any bytes)
//	  key          VARBINARY(255)  NOT NULL   Idempotency-Key (any bytes)
//	  fingerprint  BINARY(32)      NOT NULL   SHA-256 of the request
//	  token        BINARY(16)      NOT NULL   fencing token of the current holder
//	  lease_until  DATETIME(6)                lease deadline (UTC); NULL once completed
//	  status       SMALLINT                   HTTP status; NULL while in flight
//	  headers      MEDIUMBLOB                 replayable headers (store/codec); NULL if none
//	  body         LONGBLOB                   exact body bytes; NULL if empty or omitted
//	  body_omitted BOOLEAN         NOT NULL   body was over the middleware's cap
//	  created_at   DATETIME(6)     NOT NULL   first claim (kept by a takeover)
//	  completed_at DATETIME(6)                NULL while in flight
//	  expires_at   DATETIME(6)     NOT NULL   retention deadline; the key is new again after it
//	  PRIMARY KEY (scope, key), KEY (expires_at) for Sweep
//	idemkey_records_migrations (version, applied_at)   Migrate's bookkeeping
//
// The column sizes are the limits every store enforces (store.MaxScopeLen,
// store.MaxKeyLen), so the primary key (at most 1279 bytes) fits InnoDB's
// 3072-byte index entries. Headers use the binary encoding of store/codec, the
// same as store/postgres and store/redis; a row that does not decode makes Claim
// return store.ErrCorrupt, never a panic. Leases and retentions are whole
// milliseconds, rounded up, like every store's (see store.ClaimRequest).
//
// # Claim, and why it is atomic
//
// MySQL has neither a writable CTE nor RETURNING on INSERT ... ON DUPLICATE KEY
// UPDATE, so Claim is two statements in the common case of a key seen before,
// and never a transaction:
//
//  1. A plain SELECT of the key's row by primary key (a consistent read: no lock,
//     no write). A row that may not be taken answers at once: Mismatch (other
//     fingerprint), Completed (with the record) or InFlight (with the remaining
//     lease computed by the server, rounded up to the millisecond). Replays and
//     duplicates are therefore one read.
//  2. Otherwise (no row, a row past its retention, an uncompleted row whose lease
//     expired with the same fingerprint) one INSERT ... ON DUPLICATE KEY UPDATE.
//     A new key is inserted; an existing row is updated only if it may be taken,
//     and every assignment is conditional on that test.
//
// The decision is the single write of step 2, and it is atomic under concurrent
// claims because InnoDB evaluates an ON DUPLICATE KEY UPDATE on the newest
// committed row version while holding that row's exclusive lock (an INSERT that
// finds a duplicate key waits for the lock of a concurrent writer and then reads
// its committed row, whatever the isolation level): of two claimers that both
// read an absent or takeable row in step 1, the first to get the lock inserts or
// takes the row, and the second sees the taken row (a live lease, another token)
// and leaves it untouched. The statement then tells Claim which branch it took
// through LAST_INSERT_ID(code), which the server returns with the statement's
// result (sql.Result.LastInsertId): 3 inserted, 1 taken over (the lease had
// expired; ClaimResult.Takeover), 2 replaced (past its retention: a new key), 4
// left untouched, after which Claim reads again and answers from the winner's
// row. InnoDB may roll back one of several concurrent inserts of the same new key
// as a deadlock victim (error 1213); Claim then reads again too. Both retries
// are bounded (8 attempts) and counted (Stats). The statement's clock,
// UTC_TIMESTAMP(6), is fixed when the statement starts, so a claimer that waited
// for the lock judges the winner's fresh lease against an earlier instant: it
// never takes over a lease that is live.
//
// The first assignment of the update sets the token; every later one tests
// "token = the claimer's OR the row may be taken", which holds on the same rows
// whether the server assigns left to right (MySQL; MariaDB by default) or from
// the old row (MariaDB's SIMULTANEOUS_ASSIGNMENT mode), and created_at is
// assigned before expires_at, which its test reads.
//
// The footprint of a claim that writes is the one row's lock (and, for a new key
// under REPEATABLE READ, the insert intention on its index gap) for the duration
// of one autocommit statement.
//
// # Completion in the handler's transaction
//
// A handler whose side effect lives in the same database completes the record in
// its own *sql.Tx with CompleteTx, so the side effect and the record commit or
// roll back together; a stale holder (its lease expired and a retry took the key
// over) gets store.ErrLeaseLost and rolls back. After the commit, the handler
// tells the middleware (claim.MarkCompleted); this module does not import
// the middleware, so the HTTP glue that store/postgres offers as CommitResponse
// is the caller's few lines here.
//
// # Waiting duplicates, operators, failures
//
// MySQL has no notifications: Wait (store.Waiter) polls the key's row, one read
// by primary key, with back-off (WithPollInterval). Inspect is one plain SELECT;
// Evict is one short transaction: SELECT ... FOR UPDATE (the newest committed
// version, waiting for a concurrent claim or completion), the judgement against
// the store.EvictPolicy, and the DELETE. Complete, Release and Renew are one
// token-guarded UPDATE or DELETE each; no row changed means store.ErrLeaseLost.
// Every other error (connection loss, lock wait timeout, cancellation) is the
// driver's wrapped, which the middleware answers with 503. A claim whose answer
// is lost may have been committed; it then blocks its key only until its lease
// expires, after which the same request takes it over.
package mysql
