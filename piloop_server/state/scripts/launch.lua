-- launch: keep a campaign's agents at its target. Forgets its agents that have ended, then, when asked and
-- while the campaign is active with fewer agents than its target, queues one more (a run).
-- @call KEYS 9 ARGV 7
-- KEYS[1] campaign record  KEYS[2] campaign agents  KEYS[3] campaign runs  KEYS[4] new job hash
-- KEYS[5] queue (pool, agent)  KEYS[6] jobs index  KEYS[7] events  KEYS[8] delayed  KEYS[9] expiring
-- ARGV[1] key prefix  ARGV[2] new job id  ARGV[3] pool  ARGV[4] campaign  ARGV[5] spec (JSON)  ARGV[6] by
-- ARGV[7] 1 to launch, 0 only to count
-- Reply: {agents not ended, launched (0 or 1)}.
-- @include clock
-- @include new_job
local prefix = ARGV[1]
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local st = redis.call('HGET', prefix .. 'job:' .. id, JF.state)
  if st ~= 'queued' and st ~= 'leased' and st ~= 'running' then redis.call('SREM', KEYS[2], id) end
end
local n = redis.call('SCARD', KEYS[2])
local f = redis.call('HMGET', KEYS[1], 'state', 'agents')
if ARGV[7] ~= '1' or f[1] ~= 'active' or n >= tonumber(f[2] or '0') then return {n, 0} end
if redis.call('EXISTS', KEYS[4]) == 1 then return {n, 0} end
local now = clock_ms()
new_job(KEYS[4], KEYS[5], KEYS[6], KEYS[7], now, {id = ARGV[2], kind = 'agent', pool = ARGV[3],
  campaign = ARGV[4], image = '', spec = ARGV[5], by = ARGV[6], delayed = KEYS[8], expiring = KEYS[9]})
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[3], now, ARGV[2])
return {n + 1, 1}
