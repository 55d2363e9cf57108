-- forget_worker: a worker that ended leaves `piloop worker list`, once it holds no lease.
-- @call KEYS 6 ARGV 2
-- KEYS[1] worker hash  KEYS[2] worker alive  KEYS[3] workers set  KEYS[4] agent leases  KEYS[5] evaluation leases
-- KEYS[6] events
-- ARGV[1] name  ARGV[2] by
-- Reply: 1 forgotten (or never known), 0 it still holds leases (the lease engine ends them first).
-- Fenced: the leader lease and the pass's token follow (include/fence.lua).
-- @include fence
-- @include events
if redis.call('SCARD', KEYS[4]) > 0 or redis.call('SCARD', KEYS[5]) > 0 then return 0 end
local known = redis.call('SREM', KEYS[3], ARGV[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[4], KEYS[5])
if known == 1 then
  emit(KEYS[6], 'worker.forgotten', ARGV[2], 'worker', ARGV[1])
end
return 1
