-- pool_silence: each pool's workers, and how many of them went silent (no `alive` key), for the pass's disruption
-- check: one call, where two commands a worker through a pipeline cost the server's Python 5-9 % of a core with
-- 1,000 workers, every pass.
-- @call KEYS 1 ARGV 1
-- KEYS[1] workers set  ARGV[1] key prefix
-- Reply: {pool, total, silent, pool, total, silent, ...}
local prefix = ARGV[1]
local per, order = {}, {}
for _, w in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local pool = redis.call('HGET', prefix .. 'worker:' .. w, 'pool') or ''
  if not per[pool] then
    per[pool] = {0, 0}
    table.insert(order, pool)
  end
  per[pool][1] = per[pool][1] + 1
  if redis.call('EXISTS', prefix .. 'worker:' .. w .. ':alive') == 0 then
    per[pool][2] = per[pool][2] + 1
  end
end
local out = {}
for _, pool in ipairs(order) do
  table.insert(out, pool)
  table.insert(out, per[pool][1])
  table.insert(out, per[pool][2])
end
return out
