-- due: the daemon's pass puts failed jobs whose backoff has passed back in their queues.
-- KEYS[1] delayed  KEYS[2] events
-- ARGV[1] key prefix (job hashes and queues are found by id here)  ARGV[2] batch size
-- A job still `queued` goes back at its old queue score (its place in line); one cancelled meanwhile is only
-- forgotten here. Idempotent, so a second daemon running it changes nothing more.
-- Reply: the number of jobs put back.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[1]
local n = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))) do
  local job = prefix .. 'job:' .. id
  local f = redis.call('HMGET', job, 'state', 'pool', 'kind', 'score')
  redis.call('ZREM', KEYS[1], id)
  if f[1] == 'queued' then
    redis.call('ZADD', prefix .. 'queue:' .. f[2] .. ':' .. f[3], f[4], id)
    redis.call('HDEL', job, 'retry_at')
    redis.call('HSET', job, 'updated', now)
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', 100000, '*', 'type', 'job.requeued', 'by', 'service:daemon',
      'job', id, 'after', 'backoff')
    n = n + 1
  end
end
return n
