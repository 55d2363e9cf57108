-- cancel: a queued (or waiting) job ends at once; a leased or running one is stopped at its worker's next heartbeat.
-- @call KEYS 5 ARGV 3
-- KEYS[1] job hash  KEYS[2] queue (pool, kind)  KEYS[3] events  KEYS[4] delayed (a failed job waiting to retry)
-- KEYS[5] ended
-- ARGV[1] job id  ARGV[2] by  ARGV[3] 'queued' to withdraw the job only while it waits (else nothing changes)
-- Reply: the job's state after the call ('cancelled' or 'cancelling'; with 'queued', the state it is in).
-- Error PILOOP_CONFLICT when the job has already ended.
-- @include clock
-- @include cancel_job
local st = redis.call('HGET', KEYS[1], JF.state)
if ARGV[3] == 'queued' and st ~= 'queued' then return tostring(st) end
local got = cancel_job(KEYS[1], KEYS[2], KEYS[4], KEYS[5], KEYS[3], ARGV[1], ARGV[2], 'cancelled by ' .. ARGV[2],
  clock_ms())
if got == 'cancelled' or got == 'cancelling' then return got end
return redis.error_reply('PILOOP_CONFLICT job ' .. ARGV[1] .. ' has already ended (' .. tostring(st) .. ')')
