package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
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
	waiters waitset.Set // the duplicates waiting in this process
}

var (
	_ store.Store  = (*Store)(nil)
	_ store.Waiter = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the prefix of every key the store writes (default DefaultPrefix).
// Use one prefix per application or tenant database; tests use a random one. The
// prefix should not contain "{" (see the key layout in the package doc).
func WithPrefix(prefix string) Option {
	return func(s *Store) { s.prefix = prefix }
}

// New returns a Store on client, which may be a single node (*redis.Client), a
// Sentinel failover client or a *redis.ClusterClient. New does no I/O; scripts are
// loaded on first use (EVALSHA, falling back to EVAL on NOSCRIPT).
func New(client goredis.UniversalClient, opts ...Option) *Store {
	s := &Store{client: client, prefix: DefaultPrefix}
	s.waiters.Idle = DefaultSubscriberIdle
	for _, o := range opts {
		o(s)
	}
	s.channel = s.prefix + "waits"
	s.waiters.Listen = s.subscribe
	if s.waiters.OnError == nil {
		WithLogger(slog.Default())(s)
	}
	return s
}

// Key returns the Redis key holding id's record (layout in the package doc). Useful
// for inspection and tests.
func (s *Store) Key(id store.ID) string { return keyFor(s.prefix, id) }

// Claim implements store.Store with one script call. A refused claim carries the
// stored record (Completed) or the remaining lease (InFlight) from the same call.
// Errors: store.ErrInvalid for bad arguments, store.ErrCorrupt for foreign data under
// the key, otherwise the client's error (connection, timeout, cancellation).
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := req.Validate(); err != nil {
		return store.ClaimResult{}, err
	}
	tok := req.ClaimToken()
	v, err := s.eval(ctx, "claim", claimScript, req.ID,
		req.Fingerprint[:], tok[:], codec.Millis(req.Lease), codec.Millis(req.Retention))
	if err != nil {
		return store.ClaimResult{}, err
	}
	return claimResult(v, req.Fingerprint, tok)
}

func claimResult(v any, fp store.Fingerprint, tok store.Token) (store.ClaimResult, error) {
	r, code, err := asReply(v)
	if err != nil {
		return store.ClaimResult{}, err
	}
	switch code {
	case 1:
		takeover, ok := r.int(1)
		if !ok {
			return store.ClaimResult{}, corrupt("claim reply")
		}
		return store.ClaimResult{Outcome: store.Claimed, Token: tok, Takeover: takeover == 1}, nil
	case 2:
		rec, err := r.record(fp)
		if err != nil {
			return store.ClaimResult{}, err
		}
		return store.ClaimResult{Outcome: store.Completed, Record: rec}, nil
	case 3:
		ms, ok := r.int(1)
		if !ok || ms < 0 {
			return store.ClaimResult{}, corrupt("remaining lease")
		}
		return store.ClaimResult{Outcome: store.InFlight, RetryAfter: time.Duration(ms) * time.Millisecond}, nil
	case 4:
		return store.ClaimResult{Outcome: store.Mismatch}, nil
	}
	return store.ClaimResult{}, corrupt("claim reply code")
}

// Complete implements store.Store with one script call: the record becomes completed
// and its key expires retention from now on the Redis clock. store.ErrLeaseLost when
// token no longer holds id, including when the record is already completed by another
// Complete call (a client's re-delivery of this very call, after a lost reply, answers
// nil); other errors as for Claim.
func (s *Store) Complete(ctx context.Context, id store.ID, token store.Token, resp store.Response, retention time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateResponse(resp, retention); err != nil {
		return err
	}
	omitted := ""
	if resp.BodyOmitted {
		omitted = "1"
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	head := codec.EncodeHeader(resp.Header)
	if head == nil {
		head = []byte{}
	}
	// The nonce tells a re-delivery of this call (a client retry after a lost
	// reply) from a second Complete: only the latter is refused.
	nonce := store.NewToken()
	return s.fenced(ctx, "complete", completeScript, id,
		token[:], codec.Millis(retention), strconv.Itoa(resp.Status), head, body, omitted, nonce[:], s.channel)
}

// Release implements store.Store with one script call: the in-flight record is
// deleted. store.ErrLeaseLost when token no longer holds id (including a completed
// record); other errors as for Claim.
func (s *Store) Release(ctx context.Context, id store.ID, token store.Token) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	return s.fenced(ctx, "release", releaseScript, id, token[:], s.channel)
}

// Renew implements store.Store with one script call: the lease deadline becomes now
// + lease on the Redis clock, and the key's TTL is raised to cover it.
// store.ErrLeaseLost when token no longer holds id or the record is completed; other
// errors as for Claim.
func (s *Store) Renew(ctx context.Context, id store.ID, token store.Token, lease time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateLease(lease); err != nil {
		return err
	}
	return s.fenced(ctx, "renew", renewScript, id, token[:], codec.Millis(lease))
}

func (s *Store) fenced(ctx context.Context, op string, sc *goredis.Script, id store.ID, args ...any) error {
	v, err := s.eval(ctx, op, sc, id, args...)
	if err != nil {
		return err
	}
	_, code, err := asReply(v)
	if err != nil {
		return err
	}
	switch code {
	case 1:
		return nil
	case 0:
		return fmt.Errorf("idemkey/store/redis: %s: %w", op, store.ErrLeaseLost)
	}
	return corrupt(op + " reply code")
}

// eval runs one script on id's key: one round trip (EVALSHA; EVAL after NOSCRIPT).
func (s *Store) eval(ctx context.Context, op string, sc *goredis.Script, id store.ID, args ...any) (any, error) {
	if s.client == nil {
		return nil, fmt.Errorf("%w: redis: nil client", store.ErrInvalid)
	}
	v, err := sc.Run(ctx, s.client, []string{keyFor(s.prefix, id)}, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("idemkey/store/redis: %s: %w", op, err)
	}
	return v, nil
}

// The operations below are the fast-path primitives of store/tiered, where Redis is a
// cache in front of an authoritative store. Each is one script call.

// Peek reads id's record without changing it and answers what Redis alone can answer
// for a request with fingerprint fp: Completed (with the record), InFlight (a live
// lease, same fingerprint) or Mismatch (completed for another fingerprint). ok is
// false when Redis cannot decide: no record, an expired lease, or an in-flight record
// of another fingerprint. Errors as for Claim.
func (s *Store) Peek(ctx context.Context, id store.ID, fp store.Fingerprint) (res store.ClaimResult, ok bool, err error) {
	if err := id.Validate(); err != nil {
		return res, false, err
	}
	v, err := s.eval(ctx, "peek", peekScript, id, fp[:])
	if err != nil {
		return res, false, err
	}
	r, code, err := asReply(v)
	if err != nil {
		return res, false, err
	}
	if code == 0 {
		return res, false, nil
	}
	if code == 1 {
		return res, false, corrupt("peek reply code")
	}
	res, err = claimResult([]any(r), fp, store.Token{})
	return res, err == nil, err
}

// Mark overwrites id's key with an in-flight marker held by token (the token the
// authoritative store issued) whose key expires with lease on the Redis clock.
// Complete, Release and Renew with the same token then act on the marker. Errors:
// store.ErrInvalid (empty key, zero token, lease <= 0), otherwise the client's error.
func (s *Store) Mark(ctx context.Context, id store.ID, fp store.Fingerprint, token store.Token, lease time.Duration) error {
	if err := store.ValidateHolder(id, token); err != nil {
		return err
	}
	if err := store.ValidateLease(lease); err != nil {
		return err
	}
	_, err := s.eval(ctx, "mark", markScript, id, fp[:], token[:], codec.Millis(lease))
	return err
}

// Fill writes the completed record rec (as the authoritative store returned it) to
// id's key and lets the key expire after ttl on the Redis clock. A record already
// under the key is left alone: a completed record is rec or a newer one, and a marker
// is a newer claim's (overwriting it would answer Mismatch to that claim's retries)
// or expires with its lease; foreign data is replaced. Record times are kept as
// given (the authoritative store's clock), at millisecond precision. Errors:
// store.ErrInvalid (empty key, nil record, invalid response or ttl), or the client's.
func (s *Store) Fill(ctx context.Context, id store.ID, rec *store.Record, ttl time.Duration) error {
	if err := store.ValidateRecord(id, rec, ttl); err != nil {
		return err
	}
	omitted := ""
	if rec.BodyOmitted {
		omitted = "1"
	}
	body := rec.Body
	if body == nil {
		body = []byte{}
	}
	head := codec.EncodeHeader(rec.Header)
	if head == nil {
		head = []byte{}
	}
	_, err := s.eval(ctx, "fill", fillScript, id,
		rec.Fingerprint[:], rec.CreatedAt.UnixMilli(), rec.CompletedAt.UnixMilli(), rec.ExpiresAt.UnixMilli(),
		codec.Millis(ttl), strconv.Itoa(rec.Status), head, body, omitted)
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
		return fmt.Errorf("%w: redis: nil client", store.ErrInvalid)
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
