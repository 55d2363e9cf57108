-- enqueue: put a new job in its pool's queue.
-- @call KEYS 6 ARGV 8
-- KEYS[1] job hash   KEYS[2] queue (pool, kind)   KEYS[3] jobs index   KEYS[4] events   KEYS[5] delayed
-- KEYS[6] expiring
-- ARGV[1] job id  ARGV[2] kind  ARGV[3] pool  ARGV[4] campaign  ARGV[5] image
-- ARGV[6] spec (JSON)  ARGV[7] by (who asked)  ARGV[8] when it is queued (ms; empty: Redis's clock, as in
-- production: a caller passes one only to give jobs distinct, known times)
-- Reply: when it was queued (ms). Error PILOOP_CONFLICT when the id exists.
-- @include clock
-- @include new_job
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('PILOOP_CONFLICT job ' .. ARGV[1] .. ' exists')
end
local now = ARGV[8] ~= '' and tonumber(ARGV[8]) or clock_ms()
new_job(KEYS[1], KEYS[2], KEYS[3], KEYS[4], now, {id = ARGV[1], kind = ARGV[2], pool = ARGV[3],
  campaign = ARGV[4], image = ARGV[5], spec = ARGV[6], by = ARGV[7], delayed = KEYS[5], expiring = KEYS[6]})
return now
