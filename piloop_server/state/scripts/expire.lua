-- expire: the daemon's pass over lease deadlines.
-- KEYS[1] deadlines  KEYS[2] daemon hash  KEYS[3] events  KEYS[4] campaign live  KEYS[5] workers
-- ARGV[1] key prefix  ARGV[2] grace (ms)  ARGV[3] toleration (ms)  ARGV[4] max_lost
-- ARGV[5] batch size  ARGV[6] held pools (space-separated; their leases wait)
-- Reply: {'rearmed', n} when the daemon itself was absent longer than the grace period (every
-- lease and worker is re-armed, nothing expires), else {'expired', n, lost job ids...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[1]
local grace, tol = tonumber(ARGV[2]), tonumber(ARGV[3])
local last = tonumber(redis.call('HGET', KEYS[2], 'last_pass') or '0')
redis.call('HSET', KEYS[2], 'last_pass', now)

if last > 0 and now - last > grace then
  local n = 0
  for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    local token = redis.call('HGET', prefix .. 'job:' .. id, 'token')
    if token and token ~= '' then
      redis.call('SET', prefix .. 'lease:' .. id, token, 'PX', tol)
      redis.call('ZADD', KEYS[1], now + tol, id)
      n = n + 1
    end
  end
  for _, w in ipairs(redis.call('SMEMBERS', KEYS[5])) do
    redis.call('SET', prefix .. 'worker:' .. w .. ':alive', '1', 'PX', grace)
  end
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', 100000, '*', 'type', 'daemon.rearmed',
    'by', 'service:daemon', 'gap_ms', tostring(now - last), 'leases', tostring(n))
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
  local f = redis.call('HMGET', job, 'kind', 'pool', 'worker', 'campaign', 'token', 'score', 'lost')
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
    local state
    if kind == 'agent' then
      state = 'worker_lost'
      redis.call('HINCRBY', KEYS[4], f[4] or '', -1)
      redis.call('HSET', job, 'state', state, 'reason', 'its worker ' .. worker .. ' went silent',
        'ended', now, 'updated', now)
    else
      local lost = tonumber(f[7] or '0') + 1
      if lost >= tonumber(ARGV[4]) then
        state = 'lost'
        redis.call('HSET', job, 'state', state, 'lost', lost,
          'reason', 'lost ' .. lost .. ' times in a row', 'ended', now, 'updated', now)
        out[#out + 1] = id
      else
        state = 'queued'
        redis.call('ZADD', prefix .. 'queue:' .. pool .. ':' .. kind, f[6], id)
        redis.call('HSET', job, 'state', state, 'lost', lost, 'worker', '', 'token', '', 'updated', now)
      end
    end
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', 100000, '*', 'type', 'lease.expired',
      'by', 'service:daemon', 'job', id, 'token', f[5] or '', 'worker', worker, 'then', state)
    n = n + 1
  end
end
out[2] = n
return out
