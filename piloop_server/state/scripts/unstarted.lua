-- unstarted: the daemon's pass ends the queued jobs whose expiry has come with no lease (a claim ends one it meets
-- first): include/expiry.lua. A job that started, ended or is gone meanwhile is only forgotten here. Idempotent,
-- so a second daemon running it changes nothing more.
-- @call KEYS 4 ARGV 2
-- KEYS[1] expiring  KEYS[2] delayed  KEYS[3] events  KEYS[4] ended
-- ARGV[1] key prefix (job hashes and queues are found by id here)  ARGV[2] batch size
-- Reply: the number of jobs that ended `expired`.
-- Fenced: the leader lease and the pass's token follow (include/fence.lua).
-- @include fence
-- @include clock
-- @include expiry
local now = clock_ms()
local prefix = ARGV[1]
local n = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))) do
  local job = prefix .. 'job:' .. id
  local f = redis.call('HMGET', job, JF.pool, JF.kind)
  redis.call('ZREM', KEYS[1], id)
  if f[1] and expire_unstarted(job, prefix .. 'queue:' .. f[1] .. ':' .. tostring(f[2]), KEYS[4], KEYS[3], KEYS[1],
      KEYS[2], id, now, 'service:daemon') then
    n = n + 1
  end
end
return n
