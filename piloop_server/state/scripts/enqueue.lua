-- enqueue: put a new job in its pool's queue.
-- KEYS[1] job hash   KEYS[2] queue (pool, kind)   KEYS[3] jobs index   KEYS[4] events
-- ARGV[1] job id  ARGV[2] kind  ARGV[3] pool  ARGV[4] campaign  ARGV[5] image
-- ARGV[6] spec (JSON)  ARGV[7] by (who asked)
-- Reply: the queue score (ms). Error PILOOP_CONFLICT when the id exists.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('PILOOP_CONFLICT job ' .. ARGV[1] .. ' exists')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1],
  'id', ARGV[1], 'kind', ARGV[2], 'pool', ARGV[3], 'campaign', ARGV[4], 'image', ARGV[5],
  'spec', ARGV[6], 'state', 'queued', 'attempts', 0, 'lost', 0, 'score', now,
  'created', now, 'updated', now, 'by', ARGV[7], 'worker', '', 'token', '')
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZADD', KEYS[3], now, ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', 100000, '*',
  'type', 'job.queued', 'by', ARGV[7], 'job', ARGV[1], 'pool', ARGV[3], 'kind', ARGV[2])
return now
