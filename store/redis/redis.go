package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
	"github.com/idemkey/idemkey/store/waitset"
)

// DefaultPrefix is the key prefix used when WithPrefix is not given.
const DefaultPrefix = "idemkey:"

// Store is a store.Store on Redis. Create it with New; it is safe for concurrent use.
type Store struct {
	client  goredis.UniversalClient
	prefix  string
	channel string      // the waiters' channel: <prefix>waits
	chanArg any         // channel, boxed once (the completion's argument)
	waiters waitset.Set // the duplicates waiting in this process
}

var (
	_ store.Store  = (*Store)(nil)
	_ store.Waiter = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the prefix of every key the store writes (default DefaultPrefix).
// Use one prefix per application or tenant database; tests use a random one. A
// prefix containing "{" or "}" makes New fail: the first braces of a key are its
// Cluster hash tag (see the key layout in the package doc).
func WithPrefix(prefix string) Option {
	return func(s *Store) { s.prefix = prefix }
}

// New returns a Store on client, which may be a single node (*redis.Client), a
// Sentinel failover client or a *redis.ClusterClient; create it with
// ContextTimeoutEnabled, or the store's deadlines do not bound socket reads. New
// does no I/O; scripts are loaded on first use (EVALSHA, falling back to EVAL on
// NOSCRIPT). Errors (store.ErrInvalid): a nil client, a prefix with a brace.
func New(client goredis.UniversalClient, opts ...Option) (*Store, error) {
	s := &Store{client: client, prefix: DefaultPrefix}
	s.waiters.Idle = DefaultWaiterIdle
	for _, o := range opts {
		o(s)
	}
	switch {
	case client == nil:
		return nil, fmt.Errorf("idemkey/store/redis: %w: nil client", store.ErrInvalid)
	case strings.ContainsAny(s.prefix, "{}"):
		return nil, fmt.Errorf("idemkey/store/redis: %w: WithPrefix %q contains a brace, which would move the Cluster hash tag", store.ErrInvalid, s.prefix)
	}
	s.channel = s.prefix + "waits"
	s.chanArg = s.channel
	s.waiters.Listen = s.subscribe
	if s.waiters.OnError == nil {
		WithLogger(nil)(s)
	}
	return s, nil
}

// Key returns the Redis key holding id's record (layout in the package doc). Useful
// for inspection and tests.
func (s *Store) Key(id store.ID) string { return keyFor(s.prefix, id) }

// Claim implements store.Store. The common answers take one command: SET NX GET
// writes the marker of a new key (Claimed) or returns the value already there,
// read in Go: a record (Completed or Mismatch), a marker of another request
// (Mismatch) or of this very claim (a re-delivery: Claimed). A marker of the same
// request held by another token takes a PTTL (InFlight while its lease is live)
// and, when the lease ended, one script that takes it over. A server full with
// noeviction refuses the SET even when the key exists: a GET then answers what
// needs no write. Errors:
// store.ErrInvalid for bad arguments, store.ErrCorrupt for foreign data under the
// key, otherwise the client's error (connection, timeout, cancellation).
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := req.Validate(); err != nil {
		return store.ClaimResult{}, err
	}
	if s.client == nil {
		return store.ClaimResult{}, errNilClient
	}
	tok := req.ClaimToken()
	key := keyFor(s.prefix, req.ID)
	lease, ret := ttlMillis(req.Lease), ttlMillis(req.Retention)
	c := newSetNXGet(key, ret)
	m := c.marker[:]
	putMarker(m, req.Fingerprint, tok, time.Now().UnixMilli(), ret-lease)
	v, err := c.run(ctx, s.client)
	switch {
	case err == goredis.Nil:
		return store.ClaimResult{Outcome: store.Claimed, Token: tok}, nil
	case isWrongType(err):
		return s.legacyClaim(ctx, key, req, tok, m)
	case isOOM(err):
		return s.claimWhenFull(ctx, key, req, tok, m, err)
	case err != nil:
		return store.ClaimResult{}, fmt.Errorf("idemkey/store/redis: claim: %w", err)
	}
	return s.answer(ctx, key, req, tok, m, v)
}

// answer decides a claim of req (token tok, marker m) from v, the value found
// under key.
func (s *Store) answer(ctx context.Context, key string, req store.ClaimRequest, tok store.Token, m []byte, v string) (store.ClaimResult, error) {
	switch kindOf(v) {
	case kindRecord:
		return judgeRecord(v, req.Fingerprint)
	case kindMarker:
		mk := decodeMarker(v)
		switch {
		case mk.fp != req.Fingerprint:
			return store.ClaimResult{Outcome: store.Mismatch}, nil
		case mk.token == tok: // a re-delivery of this very claim
			return store.ClaimResult{Outcome: store.Claimed, Token: tok}, nil
		}
		left, err := s.leaseLeft(ctx, "claim", key, &mk)
		if err != nil {
			return store.ClaimResult{}, err
		}
		if left > 0 {
			return store.ClaimResult{Outcome: store.InFlight, RetryAfter: left}, nil
		}
		return s.contend(ctx, key, req, tok, m)
	}
	return store.ClaimResult{}, corrupt("value under the record key")
}

// claimWhenFull answers a claim whose SET NX GET a full server refused (over
// maxmemory with noeviction, Redis refuses a SET whole, even one whose NX
// finds the key): a GET reads the key, and what it decides without a write (a
// replay, a mismatch, a duplicate in flight) is answered as usual; a claim
// that must write (no key; a lapsed lease, whose takeover script the server
// refuses at its write) gets the refusal, oom.
func (s *Store) claimWhenFull(ctx context.Context, key string, req store.ClaimRequest, tok store.Token, m []byte, oom error) (store.ClaimResult, error) {
	v, err := s.client.Get(ctx, key).Result()
	if err != nil { // goredis.Nil included: the claim must write
		return store.ClaimResult{}, fmt.Errorf("idemkey/store/redis: claim: %w", oom)
	}
	return s.answer(ctx, key, req, tok, m, v)
}

// judgeRecord answers a claim of fp that found the record v.
func judgeRecord(v string, fp store.Fingerprint) (store.ClaimResult, error) {
	if recordFingerprint(v) != fp {
		return store.ClaimResult{Outcome: store.Mismatch}, nil
	}
	rec, err := decodeRecord(v)
	if err != nil {
		return store.ClaimResult{}, err
	}
	return store.ClaimResult{Outcome: store.Completed, Record: rec}, nil
}

// leaseLeft is what remains of mk's lease, read from its key's PTTL (one round
// trip, the Redis clock): 0 once the lease ended, the key is gone (PTTL -2) or
// has no expiry (-1), where only contendScript may decide.
func (s *Store) leaseLeft(ctx context.Context, op, key string, mk *marker) (time.Duration, error) {
	pttl, err := s.client.PTTL(ctx, key).Result()
	if err != nil {
		return 0, fmt.Errorf("idemkey/store/redis: %s: pttl: %w", op, err)
	}
	if left := mk.remaining(pttl); pttl > 0 && left > 0 {
		return left.Truncate(time.Millisecond), nil
	}
	return 0, nil
}

// contend runs contendScript: the lease of the marker found expired, or the
// key changed between the SET and the PTTL.
func (s *Store) contend(ctx context.Context, key string, req store.ClaimRequest, tok store.Token, m []byte) (store.ClaimResult, error) {
	v, err := s.run(ctx, "claim", contendScript, key,
		req.Fingerprint[:], tok[:], ttlMillis(req.Lease), ttlMillis(req.Retention), m)
	if err != nil {
		return store.ClaimResult{}, err
	}
	r, code, err := asReply(v)
	switch {
	case err != nil:
		return store.ClaimResult{}, err
	case code == -2:
		return s.legacyClaim(ctx, key, req, tok, m)
	case code == 1:
		takeover, _ := r.int(1)
		return store.ClaimResult{Outcome: store.Claimed, Token: tok, Takeover: takeover == 1}, nil
	case code == 2:
		rec, _ := r.str(1)
		if kindOf(rec) != kindRecord {
			return store.ClaimResult{}, corrupt("claim reply")
		}
		return judgeRecord(rec, req.Fingerprint)
	case code == 3:
		ms, ok := r.int(1)
		if !ok || ms < 0 {
			return store.ClaimResult{}, corrupt("remaining lease")
		}
		return store.ClaimResult{Outcome: store.InFlight, RetryAfter: time.Duration(ms) * time.Millisecond}, nil
	case code == 4:
		return store.ClaimResult{Outcome: store.Mismatch}, nil
	}
	return store.ClaimResult{}, corrupt("claim reply code")
}

// Complete implements store.Store with one script call: the marker of token
// becomes the completed record (its times on this process's clock) and its key
// expires retention from now on the Redis clock. A record token already
// completed with the same status, body and omitted mark (a completion retried
// after its reply was lost, or the client's re-delivery of this very call)
// answers nil and is left as it is, in the same script. store.ErrLeaseLost when
// token no longer holds id, including a record completed by another token or
// with another response; other errors as for Claim.
func (s *Store) Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateResponse(resp, retention); err != nil {
		return err
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	// The nonce tells a re-delivery of this call (a client retry after a lost
	// reply) from a second Complete: only the latter is refused.
	nonce := store.NewToken()
	ret, now := ttlMillis(retention), time.Now().UnixMilli()
	// 256 bytes hold the tail (38) and the headers of most responses in one
	// allocation; AppendHeader grows it for more.
	rest, head := recordTail(make([]byte, 0, 256), nonce, now, now+ret, resp)
	key := keyFor(s.prefix, id)
	if s.client == nil {
		return errNilClient
	}
	v, err := newCompleteCmd(key, token[:], head, rest, body, ret, s.chanArg).run(ctx, s.client)
	if err != nil {
		return fmt.Errorf("idemkey/store/redis: complete: %w", err)
	}
	return s.fencedReply("complete", v, func() error {
		return s.legacyComplete(ctx, key, token, resp, retention, nonce)
	})
}

// Release implements store.Store with one script call: the marker is deleted.
// store.ErrLeaseLost when token no longer holds id (including a completed
// record); other errors as for Claim.
func (s *Store) Release(ctx context.Context, id store.ID, token store.Token) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	key := keyFor(s.prefix, id)
	return s.fenced(ctx, "release", releaseScript, key, func() error {
		return s.fencedLegacy(ctx, "release", legacyReleaseScript, key, token[:], s.channel)
	}, token[:], s.channel)
}

// Renew implements store.Store with one script call: the lease ends lease from
// now on the Redis clock, and the key's TTL is raised to cover it.
// store.ErrLeaseLost when token no longer holds id or the record is completed;
// other errors as for Claim.
func (s *Store) Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateLease(lease); err != nil {
		return err
	}
	key := keyFor(s.prefix, id)
	return s.fenced(ctx, "renew", renewScript, key, func() error {
		return s.fencedLegacy(ctx, "renew", legacyRenewScript, key, token[:], codec.Millis(lease))
	}, token[:], codec.Millis(lease))
}

// fenced runs a fenced script; legacy runs instead when the key holds a hash.
func (s *Store) fenced(ctx context.Context, op string, sc *goredis.Script, key string, legacy func() error, args ...any) error {
	v, err := s.run(ctx, op, sc, key, args...)
	if err != nil {
		return err
	}
	return s.fencedReply(op, v, legacy)
}

// fencedReply judges a fenced script's reply v; legacy runs when the key holds
// a hash.
func (s *Store) fencedReply(op string, v any, legacy func() error) error {
	_, code, err := asReply(v)
	switch {
	case err != nil:
		return err
	case code == 1:
		return nil
	case code == 0:
		return fmt.Errorf("idemkey/store/redis: %s: %w", op, store.ErrLeaseLost)
	case code == -2:
		return legacy()
	}
	return corrupt(op + " reply code")
}

// run runs one script on key: one round trip (EVALSHA; EVAL after NOSCRIPT).
func (s *Store) run(ctx context.Context, op string, sc *goredis.Script, key string, args ...any) (any, error) {
	if s.client == nil {
		return nil, errNilClient
	}
	v, err := sc.Run(ctx, s.client, []string{key}, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("idemkey/store/redis: %s: %w", op, err)
	}
	return v, nil
}

var errNilClient = fmt.Errorf("idemkey/store/redis: %w: nil client", store.ErrInvalid)

// millis is ms milliseconds as a Duration (go-redis then sends PX, or EX for
// whole seconds); ms is at most maxTTL.
func millis(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// maxTTL is the longest TTL in ms that a Duration holds (about 292 years).
const maxTTL = int64(math.MaxInt64 / time.Millisecond)

// ttlMillis is d as a key's TTL in whole ms: codec.Millis, clamped to maxTTL.
// Unclamped, millis of a "forever" retention (math.MaxInt64) overflowed to a
// negative Duration, go-redis sent no PX, and the marker had no expiry.
func ttlMillis(d time.Duration) int64 { return min(codec.Millis(d), maxTTL) }

// isWrongType reports whether err is Redis's WRONGTYPE: the key holds a legacy
// hash (or foreign data of another type).
func isWrongType(err error) bool {
	if err == nil {
		return false // and no allocation for errors.As
	}
	var re goredis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE")
}

// isOOM reports whether err is Redis's refusal of a write over its maxmemory.
func isOOM(err error) bool {
	if err == nil {
		return false // and no allocation for errors.As
	}
	var re goredis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "OOM ")
}

// The operations below are the fast-path primitives of store/tiered, where Redis is a
// cache in front of an authoritative store.

// Peek reads id's record without changing it and answers what Redis alone can answer
// for a request with fingerprint fp: Completed (with the record), InFlight (a live
// lease, same fingerprint) or Mismatch (completed for another fingerprint). ok is
// false when Redis cannot decide: no record, an expired lease, or an in-flight record
// of another fingerprint. One GET (and a PTTL for a marker of the same request).
// Errors as for Claim.
func (s *Store) Peek(ctx context.Context, id store.ID, fp store.Fingerprint) (res store.ClaimResult, ok bool, err error) {
	if err := id.Validate(); err != nil {
		return res, false, err
	}
	if s.client == nil {
		return res, false, errNilClient
	}
	key := keyFor(s.prefix, id)
	v, err := s.client.Get(ctx, key).Result()
	switch {
	case err == goredis.Nil:
		return res, false, nil
	case isWrongType(err):
		return s.legacyPeek(ctx, key, fp)
	case err != nil:
		return res, false, fmt.Errorf("idemkey/store/redis: peek: %w", err)
	}
	switch kindOf(v) {
	case kindRecord:
		res, err = judgeRecord(v, fp)
		return res, err == nil, err
	case kindMarker:
		mk := decodeMarker(v)
		if mk.fp != fp {
			return res, false, nil
		}
		left, err := s.leaseLeft(ctx, "peek", key, &mk)
		if err != nil || left == 0 {
			return res, false, err
		}
		return store.ClaimResult{Outcome: store.InFlight, RetryAfter: left}, true, nil
	}
	return res, false, corrupt("value under the record key")
}

// Mark overwrites id's key with an in-flight marker held by token (the token the
// authoritative store issued) whose key expires with lease on the Redis clock: one
// SET. Complete, Release and Renew with the same token then act on the marker.
// Errors: store.ErrInvalid (empty key, zero token, lease <= 0), otherwise the
// client's error.
func (s *Store) Mark(ctx context.Context, id store.ID, fp store.Fingerprint, token store.Token, lease time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateLease(lease); err != nil {
		return err
	}
	if s.client == nil {
		return errNilClient
	}
	ms := ttlMillis(lease)
	m := make([]byte, markerLen)
	putMarker(m, fp, token, time.Now().UnixMilli(), 0)
	if err := s.client.Set(ctx, keyFor(s.prefix, id), m, millis(ms)).Err(); err != nil {
		return fmt.Errorf("idemkey/store/redis: mark: %w", err)
	}
	return nil
}

// Fill writes the completed record rec (as the authoritative store returned it) to
// id's key and lets the key expire after ttl on the Redis clock: one SET NX GET. A
// record already under the key is left alone: a completed record is rec or a newer
// one, and a marker is a newer claim's (overwriting it would answer Mismatch to that
// claim's retries) or expires with its lease; foreign data is replaced (by a
// script). Record times are kept as given (the authoritative store's clock), at
// millisecond precision. Errors: store.ErrInvalid (empty key, nil record, invalid
// response or ttl), or the client's.
func (s *Store) Fill(ctx context.Context, id store.ID, rec *store.Record, ttl time.Duration) error {
	if err := store.ValidateRecord(id, rec, ttl); err != nil {
		return err
	}
	if s.client == nil {
		return errNilClient
	}
	key, val, ms := keyFor(s.prefix, id), encodeRecord(rec), ttlMillis(ttl)
	c := newSetNXGet(key, ms)
	c.val = val
	v, err := c.run(ctx, s.client)
	switch {
	case err == goredis.Nil:
		return nil
	case err == nil && kindOf(v) != 0:
		return nil
	case err != nil && !isWrongType(err):
		return fmt.Errorf("idemkey/store/redis: fill: %w", err)
	}
	_, err = s.run(ctx, "fill", fillScript, key, val, ms)
	return err
}

// ErrEvictionPolicy is returned by CheckEvictionPolicy when the server may evict
// record keys.
var ErrEvictionPolicy = errors.New("idemkey/store/redis: maxmemory-policy is not noeviction")

// CheckEvictionPolicy reads the server's maxmemory-policy (CONFIG GET; on Cluster,
// of the node the client picks) and returns an error wrapping ErrEvictionPolicy
// unless it is noeviction, the only policy under which Redis never drops a record
// (every record key has a TTL, so volatile-* policies evict them too). Call it at
// startup and log or refuse; managed services that disable CONFIG answer with the
// client's error instead. Not needed when the store only serves store/tiered.
func (s *Store) CheckEvictionPolicy(ctx context.Context) error {
	if s.client == nil {
		return fmt.Errorf("idemkey/store/redis: %w: nil client", store.ErrInvalid)
	}
	m, err := s.client.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return fmt.Errorf("idemkey/store/redis: config get maxmemory-policy: %w", err)
	}
	if p := m["maxmemory-policy"]; p != "noeviction" {
		return fmt.Errorf("%w: %q", ErrEvictionPolicy, p)
	}
	return nil
}
