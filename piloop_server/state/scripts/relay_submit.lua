-- relay_submit: a job queues a new job through its worker's relay, in one step with the check that
-- its lease is live under this token (held by this worker, not cancelled). The new job's fields are
-- those enqueue.lua writes, plus `parent`.
-- KEYS[1] lease  KEYS[2] job hash (the caller)  KEYS[3] new job hash  KEYS[4] queue (pool, kind)
-- KEYS[5] jobs index  KEYS[6] events
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] new job id  ARGV[5] kind  ARGV[6] pool
-- ARGV[7] campaign  ARGV[8] image  ARGV[9] spec (JSON)  ARGV[10] by
-- Reply: the queue score (ms). Errors: PILOOP_LEASE_LOST when refused (nothing changed),
-- PILOOP_CONFLICT when the new id exists.
-- @include relay_guard
-- @include new_job
if redis.call('EXISTS', KEYS[3]) == 1 then
  return redis.error_reply('PILOOP_CONFLICT job ' .. ARGV[4] .. ' exists')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
new_job(KEYS[3], KEYS[4], KEYS[5], KEYS[6], now, {id = ARGV[4], kind = ARGV[5], pool = ARGV[6],
  campaign = ARGV[7], image = ARGV[8], spec = ARGV[9], by = ARGV[10], parent = ARGV[1]})
return now
