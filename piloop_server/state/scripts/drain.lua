-- drain: a worker takes no more jobs (claims answer `draining`); what it holds runs to its end.
-- @call KEYS 2 ARGV 3
-- KEYS[1] worker hash  KEYS[2] events
-- ARGV[1] name  ARGV[2] by  ARGV[3] reason
-- Reply: 1 when the worker was known (now draining), 0 when it has no record.
-- @include events
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], 'draining') ~= '1' then
  redis.call('HSET', KEYS[1], 'draining', '1')
  emit(KEYS[2], 'worker.draining', ARGV[2], 'worker', ARGV[1], 'reason', ARGV[3])
end
return 1
