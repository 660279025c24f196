// Package redis is the Redis backend of the idempotency store (store.Store), on
// github.com/redis/go-redis/v9. It takes a redis.UniversalClient, so a single node,
// Sentinel and Cluster all work.
//
// # Use
//
//	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379",
//		ContextTimeoutEnabled: true}) // the store's deadlines bound socket reads too
//	st, err := redis.New(client, redis.WithPrefix("payments:idem:"))
//	err = st.CheckEvictionPolicy(ctx)  // at startup: records need noeviction
//	defer st.StopWaiters()             // after the last request
//	m, err := middleware.New(st, middleware.ScopeFromHeader("X-Client-ID", "anonymous"))
//	err = http.ListenAndServe(addr, m.Handler(mux))
//
// A Redis failover can lose acknowledged records (see Server configuration
// below); store/tiered puts Postgres behind it when that must not happen.
//
// # Transitions
//
// The paths every request takes are single plain commands. A claim is one
// SET key marker NX PX retention GET (Redis 7.0 or later): nil means the key was
// new and is now claimed; otherwise Redis returns what the key holds, and the
// store judges it in Go: a completed record with the request's fingerprint is
// replayed (Completed), one of another fingerprint is a Mismatch, a marker of
// another request is a Mismatch. Only a marker of the same request held by
// another token costs more: a PTTL tells its remaining lease (InFlight, with
// Retry-After), and when the lease has ended one script takes the key over,
// atomically. Complete, Release and Renew compare the fencing token before they
// write, which Redis 7 has no plain command for, so each is one small Lua script
// call (EVALSHA, falling back to EVAL when the server answers NOSCRIPT); Complete's
// is one GET and one SET: it keeps the marker's fingerprint, token and creation
// time and appends the record the application sent. Leases and retention run on
// the Redis server's clock: key TTLs set by SET PX and PEXPIRE and judged with
// PTTL, never the application's clock. A record's times (created, completed,
// expires at) are reported, never enforced, and are the application's clock (the
// claiming and the completing process's), off by its skew from Redis's.
//
// # Key layout
//
// One (scope, key) is one Redis string:
//
//	<prefix>{<len(scope) in decimal>:<scope><key>}
//
// for example idemkey:{6:tenantorder-42} for scope "tenant" and key "order-42". The
// decimal length makes the layout injective for arbitrary bytes in scope and key. The
// braces are the Cluster hash tag, so every key of one (scope, key) lives in one slot
// and each command and script is legal on Cluster. The prefix (WithPrefix, default
// "idemkey:") separates applications sharing a server; New refuses one with a brace.
// The value is either a 67-byte in-flight marker (fingerprint, fencing token and
// the lease, the key expiring with the claim's retention) or the completed record
// (fingerprint, token, millisecond times, status, the headers in the compact binary
// form store/postgres keeps, and the body as is, no base64), the key expiring with
// the record's retention; format.go documents the bytes. Leases and retentions are
// sent in whole milliseconds, rounded up, like every store's (and at most the
// 292 years a time.Duration holds, so a "forever" retention still expires).
// Anything else under a record key (another type, a malformed value, a marker
// whose key has no expiry, hence no lease to judge) answers store.ErrCorrupt;
// the store never panics on it and never takes it as a new key.
//
// # Records of the previous format
//
// Releases before this format kept each record in a Redis hash. The store still
// reads them: a command that meets a hash gets WRONGTYPE (a script answers so)
// and the store runs the previous format's script on that key, so a claim in
// flight completes, renews and releases, and a completed record replays, until
// its TTL ends it; new keys are always written as strings. A process of the
// previous release that meets a string record answers store.ErrCorrupt (503,
// fail closed, never a second execution): upgrade every process before relying
// on it, or accept 503s for keys first used during the rollout.
//
// # Server configuration and limits
//
// Every record key carries a TTL, so only maxmemory-policy noeviction keeps the
// guarantee: under any allkeys-* or volatile-* policy Redis may evict an in-flight or
// completed record under memory pressure, and the next retry runs the handler again.
// (With store/tiered, Redis is a cache and eviction is harmless.)
// CheckEvictionPolicy reads the setting at startup.
//
// Redis replication is asynchronous. A failover that promotes a replica which had
// not received the latest writes loses acknowledged claims and completions: a retry
// then runs the handler again. The Redis-only store is therefore best effort across
// failovers (WAIT or AOF with appendfsync always narrow the window but do not close
// it); when a lost write must never cause a second execution, use store/tiered, where
// Postgres decides and Redis only answers what it holds.
//
// # Fast path for store/tiered
//
// Peek, Mark and Fill are the extra operations store/tiered uses when Redis is a
// cache in front of an authoritative store: Peek answers, without writing, what Redis
// alone may answer (a completed record, a live lease of the same request), with one
// GET; Mark writes an in-flight marker carrying the authoritative store's token and
// expiring with the lease, with one SET; Fill copies a completed record in, with one
// SET NX GET (a script replaces foreign data). Complete, Release and Renew act on a
// marker exactly as on a record this store claimed.
//
// # Operators
//
// Inspect and Evict (store.Inspector) are one script call each: Inspect reads the
// record's fixed fields (the body's length, not the body) and the server's TIME; Evict
// reads, judges the record against the store.EvictPolicy and deletes the key, in
// one script, so the state it reports is the state it judged. Foreign data is
// store.ErrCorrupt and never deleted.
package redis
