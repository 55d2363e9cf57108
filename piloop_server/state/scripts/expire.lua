-- expire: the daemon's pass over lease deadlines.
-- @call KEYS 6 ARGV 6
-- KEYS[1] deadlines  KEYS[2] daemon hash  KEYS[3] events  KEYS[4] campaign live  KEYS[5] workers  KEYS[6] ended
-- ARGV[1] key prefix  ARGV[2] grace (ms)  ARGV[3] toleration (ms)  ARGV[4] max_lost
-- ARGV[5] batch size  ARGV[6] held pools (space-separated; their leases wait)
-- An expired lease of a job whose cancel was asked for ends the job `cancelled`: cancel wins, it never runs again.
-- Otherwise an agent ends `worker_lost`, and an evaluation is queued again (or ends `lost` after max_lost in a row).
-- Reply: {'rearmed', n} when the daemon itself was absent longer than the grace period (every
-- lease and worker is re-armed, nothing expires), else {'expired', n, lost job ids...}.
-- Fenced: the leader lease and the pass's token follow (include/fence.lua).
-- @include fence
-- @include clock
-- @include finish
-- @include events
local now = clock_ms()
local prefix = ARGV[1]
local grace, tol = tonumber(ARGV[2]), tonumber(ARGV[3])
local last = tonumber(redis.call('HGET', KEYS[2], 'last_pass') or '0')
redis.call('HSET', KEYS[2], 'last_pass', now)

if last > 0 and now - last > grace then
  local n = 0
  for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    local token = redis.call('HGET', prefix .. 'job:' .. id, JF.token)
    if token and token ~= '' then
      redis.call('SET', prefix .. 'lease:' .. id, token, 'PX', tol)
      redis.call('ZADD', KEYS[1], now + tol, id)
      n = n + 1
    end
  end
  for _, w in ipairs(redis.call('SMEMBERS', KEYS[5])) do
    redis.call('SET', prefix .. 'worker:' .. w .. ':alive', '1', 'PX', grace)
  end
  emit(KEYS[3], 'daemon.rearmed', 'service:daemon', 'gap_ms', tostring(now - last), 'leases', tostring(n))
  return {'rearmed', n}
end

local held = {}
for p in string.gmatch(ARGV[6], '%S+') do held[p] = true end
local out = {'expired', 0}
local n = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))) do
  local lease = prefix .. 'lease:' .. id
  local pttl = redis.call('PTTL', lease)
  local job = prefix .. 'job:' .. id
  local f = redis.call('HMGET', job, JF.kind, JF.pool, JF.worker, JF.campaign, JF.token, JF.score, JF.lost,
    JF.cancel)
  if pttl > 0 then
    redis.call('ZADD', KEYS[1], now + pttl, id)
  elseif f[1] == false then
    redis.call('ZREM', KEYS[1], id)
  elseif not held[f[2]] then
    local kind, pool, worker = f[1], f[2], f[3]
    redis.call('DEL', lease)
    redis.call('ZREM', KEYS[1], id)
    redis.call('SREM', prefix .. 'worker:' .. worker .. ':leases:' .. kind, id)
    redis.call('SREM', prefix .. 'active:' .. pool .. ':' .. kind, id)
    if kind == 'agent' then redis.call('HINCRBY', KEYS[4], f[4] or '', -1) end
    local state
    if f[8] == '1' then
      state = 'cancelled'
      finish(job, KEYS[6], id, state, 'cancelled; its worker ' .. worker .. ' went silent', now)
    elseif kind == 'agent' then
      state = 'worker_lost'
      finish(job, KEYS[6], id, state, 'its worker ' .. worker .. ' went silent', now)
    else
      local lost = tonumber(f[7] or '0') + 1
      if lost >= tonumber(ARGV[4]) then
        state = 'lost'
        finish(job, KEYS[6], id, state, 'lost ' .. lost .. ' times in a row', now, JF.lost, lost)
        out[#out + 1] = id
      else
        state = 'queued'
        redis.call('ZADD', prefix .. 'queue:' .. pool .. ':' .. kind, f[6], id)
        redis.call('HSET', job, JF.state, state, JF.lost, lost, JF.worker, '', JF.token, '', JF.updated, now)
      end
    end
    emit(KEYS[3], 'lease.expired', 'service:daemon', 'job', id, 'token', f[5] or '', 'worker', worker,
      'then', state)
    n = n + 1
  end
end
out[2] = n
return out
