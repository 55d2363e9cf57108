-- release: the holder gives a leased job back to its queue; it does not count as an attempt.
-- @call KEYS 9 ARGV 5
-- KEYS[1] lease  KEYS[2] job hash  KEYS[3] worker leases (kind)  KEYS[4] queue (pool, kind)
-- KEYS[5] deadlines  KEYS[6] active (pool, kind)  KEYS[7] campaign live  KEYS[8] events  KEYS[9] ended
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] reason  ARGV[5] the calling token's identity (owner)
-- A job whose cancel was asked for ends `cancelled` here instead: it never runs again.
-- Reply: 'ok'. Error PILOOP_LEASE_LOST when this worker does not hold the lease under this token (nothing changed).
-- @include clock
-- @include lease_check
-- @include finish
if lease_check(KEYS[1], KEYS[2], KEYS[8], ARGV[1], ARGV[2], ARGV[3], ARGV[5], 0) ~= 'ok' then
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ' is not leased to worker ' .. ARGV[3] ..
    ' under this token')
end
local now = clock_ms()
local f = redis.call('HMGET', KEYS[2], JF.score, JF.kind, JF.campaign, JF.cancel)
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[6], ARGV[1])
if f[2] == 'agent' then redis.call('HINCRBY', KEYS[7], f[3] or '', -1) end
emit(KEYS[8], 'lease.released', 'worker:' .. ARGV[3], 'job', ARGV[1], 'token', ARGV[2], 'reason', ARGV[4])
if f[4] == '1' then
  finish(KEYS[2], KEYS[9], ARGV[1], 'cancelled', 'cancelled', now)
  emit(KEYS[8], 'job.cancelled', 'worker:' .. ARGV[3], 'job', ARGV[1])
  return 'ok'
end
redis.call('ZADD', KEYS[4], f[1], ARGV[1])
redis.call('HSET', KEYS[2], JF.state, 'queued', JF.worker, '', JF.token, '', JF.updated, now)
return 'ok'
