package redis

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis/redistest"
	"github.com/idemkey/idemkey/store/storetest"
)

// legacyWriter is the store as a fleet in the middle of an upgrade sees it: every
// new key is claimed in the legacy hash format (by previousClaim, as the previous
// release wrote it), and every other call is the store's own, which must then
// read, complete, renew, release, wait on, inspect and evict hashes.
type legacyWriter struct{ *Store }

// previousClaim is the previous release's claim of a new key: a hash. ARGV fp,
// token, lease ms, retention ms. Replies 1 claimed, 0 the key exists.
var previousClaim = goredis.NewScript(`
local k = KEYS[1]
if redis.call('EXISTS', k) == 1 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', k, 'v','1', 'st','p', 'fp',ARGV[1], 'tok',ARGV[2], 'le',now + tonumber(ARGV[3]), 'ca',now)
redis.call('PEXPIRE', k, tonumber(ARGV[4]))
return 1
`)

func (l legacyWriter) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := req.Validate(); err != nil {
		return store.ClaimResult{}, err
	}
	tok := req.ClaimToken()
	n, err := previousClaim.Run(ctx, l.client, []string{keyFor(l.prefix, req.ID)},
		req.Fingerprint[:], tok[:], ttlMillis(req.Lease), ttlMillis(req.Retention)).Int()
	if err != nil || n == 0 {
		req.Token = tok
		return l.Store.Claim(ctx, req)
	}
	return store.ClaimResult{Outcome: store.Claimed, Token: tok}, nil
}

// TestLegacyClaimOfAnExpiredHash: a hash that expires between the command that
// met it (WRONGTYPE) and the legacy claim script leaves the key new, and the
// new key is claimed in the string format, not as a fresh hash.
func TestLegacyClaimOfAnExpiredHash(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	s := NewForTest(t, c, WithPrefix(redistest.Prefix(t, c)))
	req := store.ClaimRequest{ID: store.ID{Scope: "s", Key: "k"}, Lease: time.Second, Retention: time.Minute}
	tok := store.NewToken()
	m := make([]byte, markerLen)
	putMarker(m, req.Fingerprint, tok, time.Now().UnixMilli(), 59000)
	res, err := s.legacyClaim(ctx, s.Key(req.ID), req, tok, m)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("legacyClaim: %+v %v", res, err)
	}
	if typ := c.Type(ctx, s.Key(req.ID)).Val(); typ != "string" {
		t.Fatalf("a new key claimed as a %s", typ)
	}
	if res, err := s.Claim(ctx, req); err != nil || res.Outcome != store.InFlight {
		t.Errorf("duplicate: %+v %v, want InFlight", res, err)
	}
}

// TestConformanceLegacyRecords runs the whole store suite on records of the
// legacy hash format: keys stored by the previous release keep their meaning
// until their TTL ends them.
func TestConformanceLegacyRecords(t *testing.T) {
	c := redistest.Shared(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		s := NewForTest(t, c, WithPrefix(redistest.Prefix(t, c)))
		t.Cleanup(s.StopWaiters)
		return storetest.Subject{Store: legacyWriter{s}}
	})
	// The wrapper really wrote hashes.
	s := NewForTest(t, c, WithPrefix(redistest.Prefix(t, c)))
	id := store.ID{Scope: "s", Key: "k"}
	if _, err := (legacyWriter{s}).Claim(t.Context(), store.ClaimRequest{ID: id, Lease: storetest.Lease, Retention: storetest.Retention}); err != nil {
		t.Fatal(err)
	}
	if typ := c.Type(t.Context(), s.Key(id)).Val(); typ != "hash" {
		t.Fatalf("legacy claim wrote a %s", typ)
	}
}

// TestPreviousReleaseFailsClosed: the previous release's scripts (the legacy
// scripts are its scripts) meet a string of the new format as foreign data:
// ErrCorrupt (503), never a claim, a replay of garbage or a write.
func TestPreviousReleaseFailsClosed(t *testing.T) {
	c := redistest.Shared(t)
	ctx := t.Context()
	s := NewForTest(t, c, WithPrefix(redistest.Prefix(t, c)))
	for _, done := range []bool{false, true} {
		req := store.ClaimRequest{ID: store.ID{Scope: "s", Key: fmt.Sprint(done)}, Lease: time.Second, Retention: time.Minute}
		res, err := s.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			if err := s.Complete(ctx, req.ID, res.Token, store.Response{Status: 201}, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		key := s.Key(req.ID)
		before := c.Dump(ctx, key).Val()
		tok := store.NewToken()
		for name, run := range map[string]func() error{
			"claim": func() error {
				v, err := legacyClaimScript.Run(ctx, c, []string{key}, req.Fingerprint[:], tok[:], 1000, 60000, "").Result()
				if err == nil {
					_, err = claimResult(v, req.Fingerprint, tok)
				}
				return err
			},
			"complete": func() error {
				return s.fencedLegacy(ctx, "complete", legacyCompleteScript, key, res.Token[:], 60000, "200", "", "", "", tok[:], s.channel)
			},
			"release": func() error { return s.fencedLegacy(ctx, "release", legacyReleaseScript, key, res.Token[:], s.channel) },
			"renew":   func() error { return s.fencedLegacy(ctx, "renew", legacyRenewScript, key, res.Token[:], 1000) },
			"wait":    func() error { _, err := s.legacyWait(ctx, key); return err },
			"peek":    func() error { _, _, err := s.legacyPeek(ctx, key, req.Fingerprint); return err },
		} {
			if err := run(); !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("completed %v: the previous release's %s: %v, want ErrCorrupt", done, name, err)
			}
		}
		if c.Dump(ctx, key).Val() != before {
			t.Errorf("completed %v: the previous release's scripts changed the value", done)
		}
	}
}
