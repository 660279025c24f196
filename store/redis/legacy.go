package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/codec"
)

// The legacy format (format 1): one Redis hash per (scope, key), written by
// releases before the string format (format.go). The store still reads and
// completes these records: a command of the string protocol that meets a hash
// gets WRONGTYPE (or its script answers -2) and the store runs the matching
// script below on that key instead, so a claim in flight or a completed record
// of the hash format keeps working until its TTL ends it. New keys are never
// written in this format. Each script touches exactly one key, KEYS[1].
//
// Record hash fields (all values are strings; times are Unix milliseconds on the Redis
// server's clock, read with TIME inside the script):
//
//	v    format version, "1"
//	st   state: "p" in flight (pending), "c" completed
//	fp   fingerprint, 32 raw bytes
//	tok  fencing token of the holder, 16 raw bytes
//	le   lease deadline (pending only)
//	ca   created at (first claim)
//	cd   completed at (completed only)
//	ex   expires at = cd + retention (completed only)
//	s    HTTP status, decimal (completed only)
//	h    replayable headers, binary (see store/codec; completed only)
//	b    body bytes as is (completed only)
//	o    "1" when the body was omitted (completed only)
//	cn   nonce of the Complete call that completed the record (completed only), so
//	     that a client's re-delivery of that very call (go-redis retries a command
//	     whose reply was lost) answers stored, not lease lost
//	w    "1" once a duplicate waits for the claim in flight (legacyWaitScript): Complete
//	     and Release then PUBLISH the record's key on the store's channel, and
//	     only then, so a key nobody waits for publishes nothing
//
// The key's own TTL (PEXPIRE) enforces retention: a pending record lives for the
// claim's retention (never less than its lease), a completed one for the retention
// given to Complete. Anything under our key that is not such a hash answers -1
// (corrupt); the scripts never raise an error on foreign data.
//
// Result codes shared by the scripts:
//
//	-1 corrupt  0 lease lost / miss  1 claimed or ok  2 completed  3 in flight  4 mismatch

// legacyPrelude reads the record (r), the server time in ms (now) and returns -1 early on
// foreign data. It leaves r == nil for an absent key.
const legacyPrelude = `
local k = KEYS[1]
local r = redis.pcall('HMGET', k, 'v','st','fp','tok','le','ca','cd','ex','s','h','b','o','cn','w')
if type(r) ~= 'table' or r['err'] then return {-1} end
if not r[1] then
  if redis.call('EXISTS', k) == 1 then return {-1} end
  r = nil
elseif r[1] ~= '1' then
  return {-1}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

// legacyCompletedReply is the reply for a completed record with the caller's fingerprint.
const legacyCompletedReply = `{2, r[6] or '', r[7] or '', r[8] or '', r[9] or '', r[10] or '', r[11] or '', r[12] or ''}`

// legacyClaimScript: ARGV fp, token, lease ms, retention ms, the marker of a
// fresh claim (format.go). A hash that expired since the command that met it
// leaves the key new: it is claimed in the string format, never as a new hash.
// Replies {1, takeover} | {2, ca, cd, ex, s, h, b, o} | {3, remaining ms} | {4} | {-1}.
var legacyClaimScript = goredis.NewScript(legacyPrelude + `
local fp, tok, lease, ret = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if r == nil then
  redis.call('SET', k, ARGV[5], 'PX', ret)
  return {1, 0}
end
if r[3] ~= fp then
  if r[2] == 'c' or r[2] == 'p' then return {4} end
  return {-1}
end
if r[2] == 'c' then return ` + legacyCompletedReply + ` end
if r[2] ~= 'p' then return {-1} end
if r[4] == tok then return {1, 0} end -- a retried delivery of this very claim
local le = tonumber(r[5])
if not le then return {-1} end
if le > now then return {3, le - now} end
redis.call('HSET', k, 'tok',tok, 'le',now + lease)
redis.call('PEXPIRE', k, ret)
return {1, 1}
`)

// legacyCompleteScript: ARGV token, retention ms, status, header, body, omitted ("1" or ""),
// call nonce, the waiters' channel. Replies {1} stored (or this very call was already applied,
// or a call of the same token with the same status, body and omitted mark) | {0} lease
// lost (also when already completed by another token or response) | {-1}.
var legacyCompleteScript = goredis.NewScript(legacyPrelude + `
if r ~= nil and r[2] == 'c' and r[4] == ARGV[1] and (r[13] == ARGV[7] or
   r[9] == ARGV[3] and (r[11] or '') == ARGV[5] and (r[12] or '') == ARGV[6]) then return {1} end
if r == nil or r[4] ~= ARGV[1] or r[2] ~= 'p' then return {0} end
local ret = tonumber(ARGV[2])
redis.call('HSET', k, 'st','c', 'cd',now, 'ex',now + ret, 's',ARGV[3], 'h',ARGV[4], 'b',ARGV[5], 'o',ARGV[6], 'cn',ARGV[7])
redis.call('HDEL', k, 'le')
redis.call('PEXPIRE', k, ret)
if r[14] then redis.call('PUBLISH', ARGV[8], k) end
return {1}
`)

// legacyReleaseScript: ARGV token, the waiters' channel. Replies {1} forgotten | {0} lease
// lost | {-1}.
var legacyReleaseScript = goredis.NewScript(legacyPrelude + `
if r == nil or r[4] ~= ARGV[1] or r[2] ~= 'p' then return {0} end
redis.call('DEL', k)
if r[14] then redis.call('PUBLISH', ARGV[2], k) end
return {1}
`)

// legacyWaitScript flags a live claim in flight as waited for (field w). Replies {1}
// flagged | {0} no live claim (absent, completed, lease expired) | {-1}.
var legacyWaitScript = goredis.NewScript(legacyPrelude + `
if r == nil or r[2] == 'c' then return {0} end
if r[2] ~= 'p' then return {-1} end
local le = tonumber(r[5])
if not le then return {-1} end
if le <= now then return {0} end
redis.call('HSET', k, 'w', '1')
return {1}
`)

// legacyRenewScript: ARGV token, lease ms. Replies {1} renewed | {0} lease lost | {-1}.
// The key's TTL is raised to the lease when shorter, never lowered.
var legacyRenewScript = goredis.NewScript(legacyPrelude + `
if r == nil or r[4] ~= ARGV[1] or r[2] ~= 'p' then return {0} end
local lease = tonumber(ARGV[2])
redis.call('HSET', k, 'le', now + lease)
if redis.call('PTTL', k) < lease then redis.call('PEXPIRE', k, lease) end
return {1}
`)

// legacyPeekScript (read only): ARGV fp.
// Replies {2, ...} completed | {3, remaining ms} live lease, same fingerprint |
// {4} completed with another fingerprint | {0} nothing Redis can answer alone | {-1}.
var legacyPeekScript = goredis.NewScript(legacyPrelude + `
if r == nil then return {0} end
if r[2] == 'c' then
  if r[3] ~= ARGV[1] then return {4} end
  return ` + legacyCompletedReply + `
end
if r[2] ~= 'p' then return {-1} end
if r[3] ~= ARGV[1] then return {0} end
local le = tonumber(r[5])
if not le then return {-1} end
if le > now then return {3, le - now} end
return {0}
`)

// legacyClaim claims key, a hash of the legacy format, with legacyClaimScript.
func (s *Store) legacyClaim(ctx context.Context, key string, req store.ClaimRequest, tok store.Token, m []byte) (store.ClaimResult, error) {
	v, err := s.run(ctx, "claim", legacyClaimScript, key,
		req.Fingerprint[:], tok[:], ttlMillis(req.Lease), ttlMillis(req.Retention), m)
	if err != nil {
		return store.ClaimResult{}, err
	}
	return claimResult(v, req.Fingerprint, tok)
}

// legacyComplete completes key, a hash of the legacy format.
func (s *Store) legacyComplete(ctx context.Context, key string, token store.Token, resp store.Response, retention time.Duration, nonce store.Token) error {
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
	return s.fencedLegacy(ctx, "complete", legacyCompleteScript, key,
		token[:], codec.Millis(retention), strconv.Itoa(resp.Status), head, body, omitted, nonce[:], s.channel)
}

// fencedLegacy runs a fenced script of the legacy format on key.
func (s *Store) fencedLegacy(ctx context.Context, op string, sc *goredis.Script, key string, args ...any) error {
	return s.fenced(ctx, op, sc, key, func() error { return corrupt(op + " reply code") }, args...)
}

// legacyPeek is Peek on key, a hash of the legacy format.
func (s *Store) legacyPeek(ctx context.Context, key string, fp store.Fingerprint) (res store.ClaimResult, ok bool, err error) {
	v, err := s.run(ctx, "peek", legacyPeekScript, key, fp[:])
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

// legacyWait is the check of Wait on key, a hash of the legacy format.
func (s *Store) legacyWait(ctx context.Context, key string) (bool, error) {
	v, err := s.run(ctx, "wait", legacyWaitScript, key)
	if err != nil {
		return false, err
	}
	return waitReply(v)
}

// claimResult decodes the reply of legacyClaimScript or legacyPeekScript.
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
	return store.ClaimResult{}, fmt.Errorf("idemkey/store/redis: %w: bad claim reply code", store.ErrCorrupt)
}
