package redis

import goredis "github.com/redis/go-redis/v9"

// The Lua scripts behind every transition. Each touches exactly one key, KEYS[1], the
// record hash of one (scope, key) (see keyFor), so each is legal on Redis Cluster.
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
//	w    "1" once a duplicate waits for the claim in flight (waitScript): Complete
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

// prelude reads the record (r), the server time in ms (now) and returns -1 early on
// foreign data. It leaves r == nil for an absent key.
const prelude = `
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

// completedReply is the reply for a completed record with the caller's fingerprint.
const completedReply = `{2, r[6] or '', r[7] or '', r[8] or '', r[9] or '', r[10] or '', r[11] or '', r[12] or ''}`

// claimScript: ARGV fp, token, lease ms, retention ms.
// Replies {1, takeover} | {2, ca, cd, ex, s, h, b, o} | {3, remaining ms} | {4} | {-1}.
var claimScript = goredis.NewScript(prelude + `
local fp, tok, lease, ret = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if r == nil then
  redis.call('HSET', k, 'v','1', 'st','p', 'fp',fp, 'tok',tok, 'le',now + lease, 'ca',now)
  redis.call('PEXPIRE', k, ret)
  return {1, 0}
end
if r[3] ~= fp then
  if r[2] == 'c' or r[2] == 'p' then return {4} end
  return {-1}
end
if r[2] == 'c' then return ` + completedReply + ` end
if r[2] ~= 'p' then return {-1} end
if r[4] == tok then return {1, 0} end -- a retried delivery of this very claim
local le = tonumber(r[5])
if not le then return {-1} end
if le > now then return {3, le - now} end
redis.call('HSET', k, 'tok',tok, 'le',now + lease)
redis.call('PEXPIRE', k, ret)
return {1, 1}
`)

// completeScript: ARGV token, retention ms, status, header, body, omitted ("1" or ""),
// call nonce, the waiters' channel. Replies {1} stored (or this very call was already applied) | {0} lease
// lost (also when already completed by another call) | {-1}.
var completeScript = goredis.NewScript(prelude + `
if r ~= nil and r[2] == 'c' and r[4] == ARGV[1] and r[13] == ARGV[7] then return {1} end
if r == nil or r[4] ~= ARGV[1] or r[2] ~= 'p' then return {0} end
local ret = tonumber(ARGV[2])
redis.call('HSET', k, 'st','c', 'cd',now, 'ex',now + ret, 's',ARGV[3], 'h',ARGV[4], 'b',ARGV[5], 'o',ARGV[6], 'cn',ARGV[7])
redis.call('HDEL', k, 'le')
redis.call('PEXPIRE', k, ret)
if r[14] then redis.call('PUBLISH', ARGV[8], k) end
return {1}
`)

// releaseScript: ARGV token, the waiters' channel. Replies {1} forgotten | {0} lease
// lost | {-1}.
var releaseScript = goredis.NewScript(prelude + `
if r == nil or r[4] ~= ARGV[1] or r[2] ~= 'p' then return {0} end
redis.call('DEL', k)
if r[14] then redis.call('PUBLISH', ARGV[2], k) end
return {1}
`)

// waitScript flags a live claim in flight as waited for (field w). Replies {1}
// flagged | {0} no live claim (absent, completed, lease expired) | {-1}.
var waitScript = goredis.NewScript(prelude + `
if r == nil or r[2] == 'c' then return {0} end
if r[2] ~= 'p' then return {-1} end
local le = tonumber(r[5])
if not le then return {-1} end
if le <= now then return {0} end
redis.call('HSET', k, 'w', '1')
return {1}
`)

// renewScript: ARGV token, lease ms. Replies {1} renewed | {0} lease lost | {-1}.
// The key's TTL is raised to the lease when shorter, never lowered.
var renewScript = goredis.NewScript(prelude + `
if r == nil or r[4] ~= ARGV[1] or r[2] ~= 'p' then return {0} end
local lease = tonumber(ARGV[2])
redis.call('HSET', k, 'le', now + lease)
if redis.call('PTTL', k) < lease then redis.call('PEXPIRE', k, lease) end
return {1}
`)

// peekScript (read only): ARGV fp.
// Replies {2, ...} completed | {3, remaining ms} live lease, same fingerprint |
// {4} completed with another fingerprint | {0} nothing Redis can answer alone | {-1}.
var peekScript = goredis.NewScript(prelude + `
if r == nil then return {0} end
if r[2] == 'c' then
  if r[3] ~= ARGV[1] then return {4} end
  return ` + completedReply + `
end
if r[2] ~= 'p' then return {-1} end
if r[3] ~= ARGV[1] then return {0} end
local le = tonumber(r[5])
if not le then return {-1} end
if le > now then return {3, le - now} end
return {0}
`)

// markScript: ARGV fp, token, lease ms. Overwrites the key with an in-flight marker
// whose key expires with the lease. Replies {1}.
var markScript = goredis.NewScript(`
local k = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])
redis.call('DEL', k)
redis.call('HSET', k, 'v','1', 'st','p', 'fp',ARGV[1], 'tok',ARGV[2], 'le',now + lease, 'ca',now)
redis.call('PEXPIRE', k, lease)
return {1}
`)

// fillScript: ARGV fp, ca, cd, ex, ttl ms, status, header, body, omitted. Writes a
// completed record that expires after ttl, unless the key already holds a record
// (format 1): that one reached Redis after the authoritative read the fill copies, so
// it is the same record or a newer one. Anything else under the key is replaced.
// Replies {1} written | {0} left alone.
var fillScript = goredis.NewScript(`
local k = KEYS[1]
if redis.pcall('HGET', k, 'v') == '1' then return {0} end
redis.call('DEL', k)
redis.call('HSET', k, 'v','1', 'st','c', 'fp',ARGV[1], 'tok','', 'ca',ARGV[2], 'cd',ARGV[3], 'ex',ARGV[4],
  's',ARGV[6], 'h',ARGV[7], 'b',ARGV[8], 'o',ARGV[9])
redis.call('PEXPIRE', k, tonumber(ARGV[5]))
return {1}
`)
