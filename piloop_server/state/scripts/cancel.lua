-- cancel: a queued job ends at once; a leased or running one is stopped at its worker's next heartbeat.
-- KEYS[1] job hash  KEYS[2] queue (pool, kind)  KEYS[3] events  KEYS[4] delayed (a failed job waiting to retry)
-- KEYS[5] ended
-- ARGV[1] job id  ARGV[2] by  ARGV[3] 'queued' to withdraw the job only while it waits (else nothing changes)
-- Reply: the job's state after the call ('cancelled' or 'cancelling'; with 'queued', the state it is in).
-- Error PILOOP_CONFLICT when the job has already ended.
-- @include clock
-- @include finish
-- @include events
local st = redis.call('HGET', KEYS[1], JF.state)
if ARGV[3] == 'queued' and st ~= 'queued' then return tostring(st) end
local now = clock_ms()
if st == 'queued' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[1], JF.retry_at)
  finish(KEYS[1], KEYS[5], ARGV[1], 'cancelled', 'cancelled by ' .. ARGV[2], now)
  emit(KEYS[3], 'job.cancelled', ARGV[2], 'job', ARGV[1])
  return 'cancelled'
elseif st == 'leased' or st == 'running' then
  redis.call('HSET', KEYS[1], JF.cancel, '1', JF.updated, now)
  emit(KEYS[3], 'job.cancel_requested', ARGV[2], 'job', ARGV[1])
  return 'cancelling'
end
return redis.error_reply('PILOOP_CONFLICT job ' .. ARGV[1] .. ' has already ended (' .. tostring(st) .. ')')
