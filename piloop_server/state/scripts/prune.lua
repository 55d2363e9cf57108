-- prune: retention of ended jobs, one bounded batch (safe from two daemons at once: each batch is one script).
-- @call KEYS 3 ARGV 5
-- KEYS[1] ended  KEYS[2] ended kept  KEYS[3] jobs index
-- ARGV[1] key prefix  ARGV[2] the shorter horizon (ms)  ARGV[3] the states it applies to (space-separated)
-- ARGV[4] the longer horizon (ms; -1: those jobs are kept forever)  ARGV[5] batch size
-- A job in `ended` past the shorter horizon is removed (its hash, log, progress notes and children set, its place in the jobs
-- index) when its state is one of ARGV[3]; a job of another state moves to `kept`, whence the longer horizon
-- removes it. A job of a campaign that still exists is never removed: it moves to the campaign's `kept` set, which
-- `piloop campaign rm` hands back to `ended`. Reply: {removed, kept for a campaign, moved to kept}.
-- Fenced: the leader lease and the pass's token follow (include/fence.lua).
-- @include fence
-- @include clock
-- @include job_fields
local now = clock_ms()
local prefix = ARGV[1]
local short_ms, long_ms, batch = tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
local short = {}
for st in string.gmatch(ARGV[3], '%S+') do short[st] = true end
local removed, for_campaign, moved = 0, 0, 0

-- the job's fate once past a horizon: false when it is gone or removed, true when a campaign keeps it
local function campaign_keeps(index, id, campaign)
  if campaign and campaign ~= '' and redis.call('EXISTS', prefix .. 'campaign:' .. campaign .. ':record') == 1 then
    redis.call('ZREM', index, id)
    redis.call('SADD', prefix .. 'campaign:' .. campaign .. ':kept', id)
    for_campaign = for_campaign + 1
    return true
  end
  return false
end

local function remove(index, id)
  local job = prefix .. 'job:' .. id
  redis.call('DEL', job, job .. ':log', job .. ':progress', job .. ':children')
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', index, id)
  removed = removed + 1
end

for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - short_ms, 'LIMIT', 0, batch)) do
  local f = redis.call('HMGET', prefix .. 'job:' .. id, JF.state, JF.campaign, JF.ended)
  if not f[1] then
    redis.call('ZREM', KEYS[1], id)  -- removed by other means
  elseif not campaign_keeps(KEYS[1], id, f[2]) then
    if short[f[1]] then
      remove(KEYS[1], id)
    else
      redis.call('ZREM', KEYS[1], id)
      redis.call('ZADD', KEYS[2], tonumber(f[3]) or 0, id)
      moved = moved + 1
    end
  end
end
if long_ms >= 0 then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - long_ms, 'LIMIT', 0, batch)) do
    local f = redis.call('HMGET', prefix .. 'job:' .. id, JF.state, JF.campaign)
    if not f[1] then
      redis.call('ZREM', KEYS[2], id)
    elseif not campaign_keeps(KEYS[2], id, f[2]) then
      remove(KEYS[2], id)
    end
  end
end
return {removed, for_campaign, moved}
