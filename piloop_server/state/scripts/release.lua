-- release: give a leased job back to its queue; it does not count as an attempt.
-- KEYS[1] lease  KEYS[2] job hash  KEYS[3] worker leases (kind)  KEYS[4] queue (pool, kind)
-- KEYS[5] deadlines  KEYS[6] active (pool, kind)  KEYS[7] campaign live  KEYS[8] events
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] reason
-- Reply: 'ok'. Error PILOOP_LEASE_LOST when the token no longer holds the lease.
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ' is not leased under this token')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = redis.call('HMGET', KEYS[2], 'score', 'kind', 'campaign')
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[6], ARGV[1])
redis.call('ZADD', KEYS[4], f[1], ARGV[1])
redis.call('HSET', KEYS[2], 'state', 'queued', 'worker', '', 'token', '', 'updated', now)
if f[2] == 'agent' then redis.call('HINCRBY', KEYS[7], f[3] or '', -1) end
redis.call('XADD', KEYS[8], 'MAXLEN', '~', 100000, '*',
  'type', 'lease.released', 'by', 'worker:' .. ARGV[3], 'job', ARGV[1], 'token', ARGV[2], 'reason', ARGV[4])
return 'ok'
