-- register: a worker announces itself (at start, and again when Redis forgot it).
-- KEYS[1] worker hash  KEYS[2] worker alive  KEYS[3] workers set  KEYS[4] events
-- ARGV[1] name  ARGV[2] pool  ARGV[3] image  ARGV[4] cas id  ARGV[5] sample (JSON)
-- ARGV[6] grace (ms)  ARGV[7] protocol  ARGV[8] by  ARGV[9] info (JSON: host, pid, version)
-- Reply: 'ok'.
-- @include clock
-- @include events
local now = clock_ms()
redis.call('HSET', KEYS[1], 'name', ARGV[1], 'pool', ARGV[2], 'image', ARGV[3], 'cas', ARGV[4],
  'sample', ARGV[5], 'protocol', ARGV[7], 'info', ARGV[9], 'registered', now, 'seen', now,
  'reason', '')
if redis.call('HEXISTS', KEYS[1], 'draining') == 0 then
  redis.call('HSET', KEYS[1], 'draining', '0')
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[6])
redis.call('SADD', KEYS[3], ARGV[1])
emit(KEYS[4], 'worker.registered', ARGV[8], 'worker', ARGV[1], 'pool', ARGV[2], 'image', ARGV[3])
return 'ok'
