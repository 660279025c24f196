// Package redis is the Redis backend of the idempotency store (store.Store), on
// github.com/redis/go-redis/v9. It takes a redis.UniversalClient, so a single node,
// Sentinel and Cluster all work.
//
// # Transitions
//
// Claim, Complete, Release and Renew are each one Lua script call (EVALSHA, falling
// back to EVAL when the server answers NOSCRIPT). The fencing token is checked inside
// the script; a refused Claim returns the stored record or the remaining lease from
// the same call. Leases and retention run on the Redis server's clock: the scripts
// read TIME and set the key's TTL with PEXPIRE, never the application's clock.
//
// # Key layout
//
// One (scope, key) is one Redis hash:
//
//	<prefix>{<len(scope) in decimal>:<scope><key>}
//
// for example idemkey:{6:tenantorder-42} for scope "tenant" and key "order-42". The
// decimal length makes the layout injective for arbitrary bytes in scope and key. The
// braces are the Cluster hash tag, so every key of one (scope, key) lives in one slot
// and each script is legal on Cluster. The prefix (WithPrefix, default "idemkey:")
// separates applications sharing a server; it should not contain "{". The hash fields
// are documented in scripts.go: the format version, the state, the 32-byte
// fingerprint and 16-byte token as raw bytes, millisecond times, the status, the
// headers in the compact binary form store/postgres keeps (a format byte, then
// length-prefixed names and values) and the body as is (no base64). Leases and
// retentions are sent in whole milliseconds, rounded up, like every store's.
// Anything else under a record key (another type, another version, a malformed field)
// answers store.ErrCorrupt; the store never panics on it and never takes it as a new
// key.
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
// alone may answer (a completed record, a live lease of the same request); Mark writes
// an in-flight marker carrying the authoritative store's token and expiring with the
// lease; Fill copies a completed record in. Complete, Release and Renew act on a
// marker exactly as on a record this store claimed. Each is one script call.
//
// # Operators
//
// Inspect and Evict (store.Inspector) are one script call each: Inspect reads the
// record's fields (the body's length, not the body) and the server's TIME; Evict
// reads, judges the record against the store.EvictPolicy and deletes the key, in
// one script, so the state it reports is the state it judged. Foreign data is
// store.ErrCorrupt and never deleted.
package redis
