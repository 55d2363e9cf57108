-- due: the daemon's pass puts failed jobs whose backoff has passed back in their queues, and new jobs whose
-- countdown has passed in them.
-- @call KEYS 2 ARGV 2
-- KEYS[1] delayed  KEYS[2] events
-- ARGV[1] key prefix (job hashes and queues are found by id here)  ARGV[2] batch size
-- A job still `queued` goes back at its old queue score (its place in line); one cancelled meanwhile is only
-- forgotten here. Idempotent, so a second daemon running it changes nothing more.
-- Reply: the number of jobs put back.
-- Fenced: the leader lease and the pass's token follow (include/fence.lua).
-- @include fence
-- @include clock
-- @include job_fields
-- @include events
local now = clock_ms()
local prefix = ARGV[1]
local n = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))) do
  local job = prefix .. 'job:' .. id
  local f = redis.call('HMGET', job, JF.state, JF.pool, JF.kind, JF.score, JF.not_before)
  redis.call('ZREM', KEYS[1], id)
  if f[1] == 'queued' then
    redis.call('ZADD', prefix .. 'queue:' .. f[2] .. ':' .. f[3], f[4], id)
    redis.call('HDEL', job, JF.retry_at, JF.not_before)
    redis.call('HSET', job, JF.updated, now)
    emit(KEYS[2], 'job.requeued', 'service:daemon', 'job', id, 'after', f[5] and 'countdown' or 'backoff')
    n = n + 1
  end
end
return n
