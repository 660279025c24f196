package redis

import goredis "github.com/redis/go-redis/v9"

// The scripts of the string format (format.go), for the transitions that must
// compare before they write: Redis 7 has no SET that checks the old value. The
// common paths need none of them: a claim of a new key is SET NX GET, a replay
// the same SET answered with the record, Peek a GET and Mark a SET. Each script
// touches exactly one key, KEYS[1], so each is legal on Redis Cluster.
//
// A marker's lease is an offset from the key's expiry, so a marker whose key
// has none (PERSIST, a RESTORE without TTL) has no lease anyone can judge: the
// scripts that judge or move the lease (contend, renew, wait, inspect, evict)
// answer -1 (corrupt) rather than take it over, renew it or call it expired;
// Complete and Release still end it.
//
// Result codes shared by the scripts:
//
//	-2 the key holds another type (a legacy hash): the store runs the legacy script
//	-1 corrupt  0 lease lost / miss  1 claimed or ok  2 completed  3 in flight  4 mismatch

// prelude reads the value (v) and classifies it: kind 0 absent, 1 marker, 2
// record; it returns -1 on foreign data and -2 on a key of another type.
// Scripts with nothing but a code to say reply a plain integer.
const prelude = `
local k = KEYS[1]
local v = redis.pcall('GET', k)
if type(v) == 'table' then return -2 end
local kind = 0
if v then
  if #v == 67 and string.byte(v, 1) == 2 and string.byte(v, 2) == 112 then kind = 1
  elseif #v >= 97 and string.byte(v, 1) == 2 and string.byte(v, 2) == 99 then kind = 2
  else return -1 end
end
`

// now reads the server's clock in Unix ms (Inspect and Evict only: no
// transition reads a clock; leases are judged from the key's PTTL).
const now = `
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`

// contendScript is the claim of a key whose SET NX met a marker of the same
// request held by another token (or that changed meanwhile): it decides again,
// atomically, and takes an expired lease over, keeping the first claim's
// created at. ARGV fp, token, lease ms, retention ms, the marker of a fresh
// claim. Replies {1, takeover} | {2, record} | {3, remaining ms} | {4} | -1 | -2.
var contendScript = goredis.NewScript(prelude + `
local ret, lease = tonumber(ARGV[4]), tonumber(ARGV[3])
if kind == 0 then
  redis.call('SET', k, ARGV[5], 'PX', ret)
  return {1, 0}
end
if kind == 2 then return {2, v} end
if string.sub(v, 4, 35) ~= ARGV[1] then return {4} end
if string.sub(v, 36, 51) == ARGV[2] then return {1, 0} end
local pttl = redis.call('PTTL', k)
if pttl < 0 then return -1 end
local left = pttl - struct.unpack('>i8', v, 60)
if left > 0 then return {3, math.min(left, pttl)} end
redis.call('SET', k, string.sub(v, 1, 35) .. ARGV[2] .. string.sub(v, 52, 59) .. struct.pack('>i8', ret - lease), 'PX', ret)
return {1, 1}
`)

// completeScript turns the marker of ARGV token into the record: the record
// head (format, kind, flags), bytes 3-58 of the marker (fingerprint, token,
// created at), then the rest as sent (nonce, times, status, headers), then the
// body; one GET, one SET, no clock. ARGV token, head, rest, body, retention ms,
// the waiters' channel. Replies 1 stored, or left as it is when token already
// completed it with this very call (same nonce) or with the same status, body
// and omitted mark (a completion retried after its reply was lost) | 0 lease
// lost (also when completed by another token or with another response) | -1 |
// -2.
var completeScript = goredis.NewScript(`
local k = KEYS[1]
local v = redis.pcall('GET', k)
if type(v) == 'table' then return -2 end
if not v then return 0 end
local n, f, c = #v, string.byte(v, 1), string.byte(v, 2)
if n == 67 and f == 2 and c == 112 then
  if string.sub(v, 36, 51) ~= ARGV[1] then return 0 end
  redis.call('SET', k, ARGV[2] .. string.sub(v, 4, 59) .. ARGV[3] .. ARGV[4], 'PX', ARGV[5])
  if string.byte(v, 3) % 2 == 1 then redis.call('PUBLISH', ARGV[6], k) end
  return 1
end
if n < 97 or f ~= 2 or c ~= 99 then return -1 end
if string.sub(v, 36, 51) ~= ARGV[1] then return 0 end
if string.sub(v, 60, 75) == string.sub(ARGV[3], 1, 16) then return 1 end
local a, b, d, e = string.byte(v, 94, 97)
if string.byte(v, 3) == string.byte(ARGV[2], 3) and string.sub(v, 92, 93) == string.sub(ARGV[3], 33, 34) and
   string.sub(v, 98 + ((a * 256 + b) * 256 + d) * 256 + e) == ARGV[4] then return 1 end
return 0
`)

// releaseScript deletes the marker of ARGV token. ARGV token, the waiters'
// channel. Replies 1 | 0 lease lost | -1 | -2.
var releaseScript = goredis.NewScript(prelude + `
if kind ~= 1 or string.sub(v, 36, 51) ~= ARGV[1] then return 0 end
redis.call('DEL', k)
if string.byte(v, 3) % 2 == 1 then redis.call('PUBLISH', ARGV[2], k) end
return 1
`)

// renewScript moves the lease of ARGV token's marker to ARGV lease ms from now,
// raising the key's TTL to it when longer (never lowering it), and rewrites the
// marker's lease offset. Replies 1 | 0 lease lost | -1 | -2.
var renewScript = goredis.NewScript(prelude + `
if kind ~= 1 or string.sub(v, 36, 51) ~= ARGV[1] then return 0 end
local pttl, lease = redis.call('PTTL', k), tonumber(ARGV[2])
if pttl < 0 then return -1 end
if lease > pttl then
  redis.call('PEXPIRE', k, lease)
  pttl = lease
end
redis.call('SETRANGE', k, 59, struct.pack('>i8', pttl - lease))
return 1
`)

// waitScript flags a live marker as waited for. Replies 1 flagged | 0 no
// live claim (absent, completed, lease expired) | -1 | -2.
var waitScript = goredis.NewScript(prelude + `
if kind ~= 1 then return 0 end
local pttl = redis.call('PTTL', k)
if pttl < 0 then return -1 end
if pttl <= struct.unpack('>i8', v, 60) then return 0 end
redis.call('SETRANGE', k, 2, string.char(string.byte(v, 3) - string.byte(v, 3) % 2 + 1))
return 1
`)

// fillScript writes ARGV record with a TTL of ARGV ttl ms unless the key holds
// a record or marker of either format. Replies {1} written | {0} left alone.
var fillScript = goredis.NewScript(`
local k = KEYS[1]
local t = redis.call('TYPE', k)['ok']
if t == 'hash' and redis.call('HGET', k, 'v') == '1' then return {0} end
if t == 'string' then
  local v = redis.call('GET', k)
  if string.byte(v, 1) == 2 and ((#v == 67 and string.byte(v, 2) == 112) or (#v >= 97 and string.byte(v, 2) == 99)) then
    return {0}
  end
end
redis.call('SET', k, ARGV[1], 'PX', tonumber(ARGV[2]))
return {1}
`)

// inspectScript (read only) replies {0, now} absent | {1, now, first 97 bytes,
// length, expiry (PEXPIRETIME)} | -1 | -2.
var inspectScript = goredis.NewScript(prelude + now + `
if kind == 0 then return {0, now()} end
local exp = redis.call('PEXPIRETIME', k)
if kind == 1 and exp < 0 then return -1 end
return {1, now(), string.sub(v, 1, 97), #v, exp}
`)

// evictScript: ARGV "1" or "" for each of: a completed record, an in-flight one
// whose lease expired, one whose lease is live; then the waiters' channel.
// Deletes the key if the flag for its state is set; replies as inspectScript,
// with code 2 instead of 1 when it deleted. A record whose status or header
// length make no sense is -1, so Evict never deletes what it cannot describe.
var evictScript = goredis.NewScript(prelude + now + `
if kind == 0 then return {0, now()} end
if kind == 2 then
  local status, hlen = struct.unpack('>I2I4', v, 92)
  if status < 100 or status > 999 or 97 + hlen > #v then return -1 end
end
local t, exp = now(), redis.call('PEXPIRETIME', k)
if kind == 1 and exp < 0 then return -1 end
local allowed = ARGV[1]
if kind == 1 then
  local _, leaseEnd = struct.unpack('>i8i8', v, 52)
  if exp - leaseEnd <= t then allowed = ARGV[2] else allowed = ARGV[3] end
end
local code = 1
if allowed == '1' then
  redis.call('DEL', k)
  if kind == 1 and string.byte(v, 3) % 2 == 1 then redis.call('PUBLISH', ARGV[4], k) end
  code = 2
end
return {code, t, string.sub(v, 1, 97), #v, exp}
`)
