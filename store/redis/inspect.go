package redis

import (
	"context"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
)

var _ store.Inspector = (*Store)(nil)

// legacyInspectPrelude reads the record of KEYS[1] without its body or headers (the
// body's length only) and builds the reply info:
//
//	{0, now} absent | {1, now, st, fp, le, ca, cd, ex, s, o, body length, pttl} | {-1}
//
// A record whose fields do not make sense (unknown state, a fingerprint that is
// not 32 bytes, a missing or non-numeric time or status) answers -1 like foreign
// data, so Evict never deletes what it cannot describe.
const legacyInspectPrelude = `
local k = KEYS[1]
local r = redis.pcall('HMGET', k, 'v','st','fp','le','ca','cd','ex','s','o')
if type(r) ~= 'table' or r['err'] then return {-1} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not r[1] then
  if redis.call('EXISTS', k) == 1 then return {-1} end
  return {0, now}
end
if r[1] ~= '1' or (r[2] ~= 'c' and r[2] ~= 'p') or not r[3] or string.len(r[3]) ~= 32 then return {-1} end
local le = tonumber(r[4])
if not tonumber(r[5]) or (r[2] == 'p' and not le) then return {-1} end
if r[2] == 'c' and not (tonumber(r[6]) and tonumber(r[7]) and tonumber(r[8])) then return {-1} end
local info = {1, now, r[2], r[3], r[4] or '', r[5] or '', r[6] or '', r[7] or '', r[8] or '', r[9] or '',
  redis.call('HSTRLEN', k, 'b'), redis.call('PTTL', k)}
`

// legacyInspectScript (read only): replies as legacyInspectPrelude.
var legacyInspectScript = goredis.NewScript(legacyInspectPrelude + `
return info
`)

// legacyEvictScript: ARGV "1" or "" for each of: a completed record, an in-flight one
// whose lease expired, one whose lease is live; then the waiters' channel (a
// record a duplicate waits for is published, as by Release). Deletes the key if the flag for
// the record's state is set; replies as legacyInspectPrelude, with code 2 instead of 1
// when it deleted.
var legacyEvictScript = goredis.NewScript(legacyInspectPrelude + `
local allowed
if r[2] == 'c' then allowed = ARGV[1]
elseif le <= now then allowed = ARGV[2]
else allowed = ARGV[3] end
if allowed == '1' then
  local waited = redis.call('HGET', k, 'w')
  redis.call('DEL', k)
  if waited then redis.call('PUBLISH', ARGV[4], k) end
  info[1] = 2
end
return info
`)

// Inspect implements store.Inspector with one read-only script: the record's
// fields (not its body or headers, only the body's length) and the Redis server's
// time, in milliseconds. Now, LeaseUntil and ExpiresAt (the key's expiry) are the
// server's clock; CreatedAt and CompletedAt are the application's, as the record
// keeps them (package doc). Errors: store.ErrInvalid for an empty key, store.ErrCorrupt
// for foreign data under the key, otherwise the client's error.
func (s *Store) Inspect(ctx context.Context, id store.ID) (store.Info, error) {
	if err := store.ValidateInspect(id); err != nil {
		return store.Info{}, err
	}
	key := keyFor(s.prefix, id)
	v, err := s.run(ctx, "inspect", inspectScript, key)
	if err != nil {
		return store.Info{}, err
	}
	if _, code, err := asReply(v); err == nil && code == -2 {
		if v, err = s.run(ctx, "inspect", legacyInspectScript, key); err != nil {
			return store.Info{}, err
		}
		info, _, err := legacyInfoReply(v)
		return info, err
	}
	info, _, err := infoReply(v)
	return info, err
}

// Evict implements store.Inspector with one script that reads the record, judges
// it against policy and deletes the key if allowed, atomically. Errors as for
// Inspect, and store.ErrInvalid for an empty policy; foreign data is never
// deleted.
func (s *Store) Evict(ctx context.Context, id store.ID, policy store.EvictPolicy) (store.Info, bool, error) {
	if err := store.ValidateEvict(id, policy); err != nil {
		return store.Info{}, false, err
	}
	flag := func(b store.EvictPolicy) string {
		if policy&b != 0 {
			return "1"
		}
		return ""
	}
	key := keyFor(s.prefix, id)
	args := []any{flag(store.EvictCompleted), flag(store.EvictLeaseExpired), flag(store.EvictLive), s.channel}
	v, err := s.run(ctx, "evict", evictScript, key, args...)
	if err != nil {
		return store.Info{}, false, err
	}
	if _, code, err := asReply(v); err == nil && code == -2 {
		if v, err = s.run(ctx, "evict", legacyEvictScript, key, args...); err != nil {
			return store.Info{}, false, err
		}
		return legacyInfoReply(v)
	}
	return infoReply(v)
}

// infoReply decodes the reply of inspectScript or evictScript: {0, now} |
// {1 or 2, now, the value's first 97 bytes, its length, the key's expiry}.
func infoReply(v any) (store.Info, bool, error) {
	r, code, err := asReply(v)
	if err != nil {
		return store.Info{}, false, err
	}
	now, ok := r.int(1)
	if !ok || code < 0 || code > 2 {
		return store.Info{}, false, corrupt("inspect reply")
	}
	info := store.Info{Now: time.UnixMilli(now)}
	if code == 0 {
		return info, false, nil
	}
	head, ok1 := r.str(2)
	size, ok2 := r.int(3)
	exp, ok3 := r.int(4)
	if !ok1 || !ok2 || !ok3 || len(head) < markerLen {
		return store.Info{}, false, corrupt("inspect reply")
	}
	copy(info.Fingerprint[:], head[3:35])
	if head[1] == kindMarker {
		m := decodeMarker(head)
		info.State = store.StateInFlight
		info.CreatedAt = time.UnixMilli(m.created)
		info.LeaseUntil = time.UnixMilli(exp - m.lease)
		info.ExpiresAt = time.UnixMilli(exp)
		return info, code == 2, nil
	}
	if len(head) < recordHead {
		return store.Info{}, false, corrupt("inspect reply")
	}
	hlen := int64(uint32(head[93])<<24 | uint32(head[94])<<16 | uint32(head[95])<<8 | uint32(head[96]))
	status := int(head[91])<<8 | int(head[92])
	if status < 100 || status > 999 || recordHead+hlen > size {
		return store.Info{}, false, corrupt("record fields")
	}
	info.State = store.StateCompleted
	info.CreatedAt = time.UnixMilli(get64(head, 51))
	info.CompletedAt = time.UnixMilli(get64(head, 75))
	info.ExpiresAt = time.UnixMilli(exp)
	info.Status, info.BodyBytes, info.BodyOmitted = status, int(size-recordHead-hlen), head[2]&flagOmitted != 0
	return info, code == 2, nil
}

// legacyInfoReply decodes the reply of legacyInspectScript or legacyEvictScript.
func legacyInfoReply(v any) (store.Info, bool, error) {
	r, code, err := asReply(v)
	if err != nil {
		return store.Info{}, false, err
	}
	now, ok := r.int(1)
	if !ok || code < 0 || code > 2 {
		return store.Info{}, false, corrupt("inspect reply")
	}
	info := store.Info{Now: time.UnixMilli(now)}
	if code == 0 {
		return info, false, nil
	}
	var f [8]string // st, fp, le, ca, cd, ex, s, o
	for i := range f {
		if f[i], ok = r.str(i + 2); !ok {
			return store.Info{}, false, corrupt("inspect reply")
		}
	}
	blen, ok1 := r.int(10)
	pttl, ok2 := r.int(11)
	ms := func(s string) (time.Time, bool) {
		n, err := strconv.ParseInt(s, 10, 64)
		return time.UnixMilli(n), err == nil
	}
	created, okc := ms(f[3])
	if !ok1 || !ok2 || !okc || len(f[1]) != len(info.Fingerprint) {
		return store.Info{}, false, corrupt("record fields")
	}
	copy(info.Fingerprint[:], f[1])
	info.CreatedAt = created
	if f[0] == "p" {
		lease, ok := ms(f[2])
		if !ok {
			return store.Info{}, false, corrupt("lease deadline")
		}
		info.State, info.LeaseUntil = store.StateInFlight, lease
		if pttl > 0 {
			info.ExpiresAt = info.Now.Add(time.Duration(pttl) * time.Millisecond)
		}
		return info, code == 2, nil
	}
	completed, ok := ms(f[4])
	expires, okx := ms(f[5])
	status, err := strconv.Atoi(f[6])
	if !ok || !okx || err != nil {
		return store.Info{}, false, corrupt("completed record fields")
	}
	info.State = store.StateCompleted
	info.CompletedAt, info.ExpiresAt = completed, expires
	info.Status, info.BodyBytes, info.BodyOmitted = status, int(blen), f[7] == "1"
	return info, code == 2, nil
}
