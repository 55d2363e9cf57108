-- relay_child: a job queues a child job of its own through its worker's relay (nested work), in one step with the
-- check that its lease is live under this token (held by this worker, not cancelled: relay_guard). The child goes
-- to the caller's pool and campaign (the server sets them from the caller's record, never from the call), names the
-- caller as its `parent`, and is in the caller's `children` set, so the pass cancels it when the caller ends
-- cancelled (dependencies.lua). Its `after` may name only the caller's own children.
-- @call KEYS 7 ARGV 12
-- KEYS[1] lease  KEYS[2] job hash (the caller)  KEYS[3] events  KEYS[4] new job hash  KEYS[5] queue (pool, kind)
-- KEYS[6] jobs index  KEYS[7] ended
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] new job id  ARGV[5] kind  ARGV[6] pool  ARGV[7] spec
-- ARGV[8] by  ARGV[9] key prefix  ARGV[10] the most jobs one job may queue  ARGV[11] the deepest a child may be
-- ARGV[12] the calling token's identity (include/relay_guard.lua)
-- Reply: the child's state (queued, waiting, cancelled). Errors: PILOOP_LEASE_LOST when the lease does not allow
-- it, PILOOP_FORBIDDEN when the job may not queue this, PILOOP_CONFLICT when the id exists (nothing changed).
-- @include relay_guard
-- @include clock
-- @include new_job
-- @include dependencies
local prefix = ARGV[9]
if guard[5] ~= ARGV[6] then
  return redis.error_reply('PILOOP_FORBIDDEN job ' .. ARGV[1] .. ' may queue jobs in its own pool ' ..
    tostring(guard[5]) .. ' only, not ' .. ARGV[6])
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  return redis.error_reply('PILOOP_CONFLICT job ' .. ARGV[4] .. ' exists')
end
local depth, up = 1, ARGV[1]
while depth < tonumber(ARGV[11]) do
  up = redis.call('HGET', prefix .. 'job:' .. up, JF.parent)
  if not up or up == '' then break end
  depth = depth + 1
end
if depth >= tonumber(ARGV[11]) then
  return redis.error_reply('PILOOP_FORBIDDEN job ' .. ARGV[1] .. ' is ' .. depth .. ' jobs deep: a child of it ' ..
    'would be deeper than the ' .. ARGV[11] .. ' levels nested work may reach')
end
local n = tonumber(redis.call('HGET', KEYS[2], JF.relayed) or '0')
if n >= tonumber(ARGV[10]) then
  return redis.error_reply('PILOOP_FORBIDDEN job ' .. ARGV[1] .. ' has queued ' .. n .. ' jobs, the most one job ' ..
    'may queue from inside itself (' .. ARGV[10] .. ')')
end
local spec = cjson.decode(ARGV[7])
for _, p in ipairs(spec.after or {}) do
  if redis.call('HGET', prefix .. 'job:' .. p, JF.parent) ~= ARGV[1] then
    return redis.error_reply('PILOOP_FORBIDDEN job ' .. ARGV[1] .. ' may wait only on jobs it queued itself, not ' ..
      p)
  end
end
local now = clock_ms()
local waits = #(spec.after or {}) > 0
new_job(KEYS[4], KEYS[5], KEYS[6], KEYS[3], now, {id = ARGV[4], kind = ARGV[5], pool = ARGV[6],
  campaign = guard[4] or '', image = '', spec = ARGV[7], by = ARGV[8], parent = ARGV[1], waiting = waits})
redis.call('HINCRBY', KEYS[2], JF.relayed, 1)
redis.call('SADD', prefix .. 'job:' .. ARGV[1] .. ':children', ARGV[4])
if not waits then return 'queued' end
wait_on(prefix, ARGV[4], spec)
return settle(prefix, KEYS[3], KEYS[7], ARGV[4], ARGV[8], now)
