-- claim: lease up to N jobs of one kind to a worker, each under a new fencing token.
-- KEYS[1] worker hash  KEYS[2] worker alive  KEYS[3] worker leases (this kind)
-- KEYS[4] queue (pool, kind)  KEYS[5] deadlines  KEYS[6] active (pool, kind)  KEYS[7] token seq
-- KEYS[8] generation  KEYS[9] events  KEYS[10] campaign live  KEYS[11] daemon hash
-- ARGV[1] key prefix (job hashes are found by id here)  ARGV[2] worker  ARGV[3] kind
-- ARGV[4] slots of this kind  ARGV[5] worker image  ARGV[6] toleration (ms)  ARGV[7] most to take
-- ARGV[8] how deep to scan the queue
-- Reply: {'ok', id1, token1, id2, token2, ...} or {'none', reason}; reasons: recovering,
-- unreachable, draining, slots, nothing, image.
-- Error PILOOP_NO_GENERATION when the generation marker is missing (Redis lost its data).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold = tonumber(redis.call('HGET', KEYS[11], 'hold_until') or '0')
if hold > now then return {'none', 'recovering'} end
if redis.call('EXISTS', KEYS[2]) == 0 then return {'none', 'unreachable'} end
if redis.call('HGET', KEYS[1], 'draining') == '1' then return {'none', 'draining'} end
local free = tonumber(ARGV[4]) - redis.call('SCARD', KEYS[3])
if free <= 0 then return {'none', 'slots'} end
local gen = redis.call('GET', KEYS[8])
if not gen then return redis.error_reply('PILOOP_NO_GENERATION the generation marker is gone') end
local want = math.min(free, tonumber(ARGV[7]))
local prefix, worker, kind, image = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
local tol = tonumber(ARGV[6])
local ids = redis.call('ZRANGE', KEYS[4], 0, tonumber(ARGV[8]) - 1)
if #ids == 0 then return {'none', 'nothing'} end

-- The candidates this worker may run: the job's image is empty or the worker's.
local cands = {}
for _, id in ipairs(ids) do
  local f = redis.call('HMGET', prefix .. 'job:' .. id, 'image', 'campaign')
  if f[1] == false or f[1] == '' or f[1] == image then
    cands[#cands + 1] = {id = id, campaign = f[2] or ''}
  end
end
if #cands == 0 then return {'none', 'image'} end

local out = {'ok'}
local taken = {}
for _ = 1, want do
  local pick = nil
  if kind == 'agent' then
    -- the campaign with the fewest live agents; ties go to the oldest job
    local best = nil
    for i, c in ipairs(cands) do
      if not taken[i] then
        local live = tonumber(redis.call('HGET', KEYS[10], c.campaign) or '0')
        if best == nil or live < best then best, pick = live, i end
      end
    end
  else
    for i, _ in ipairs(cands) do
      if not taken[i] then pick = i; break end
    end
  end
  if pick == nil then break end
  taken[pick] = true
  local id, campaign = cands[pick].id, cands[pick].campaign
  local token = string.format('%d%012d', tonumber(gen), redis.call('INCR', KEYS[7]))
  local job = prefix .. 'job:' .. id
  redis.call('ZREM', KEYS[4], id)
  redis.call('SET', prefix .. 'lease:' .. id, token, 'PX', tol)
  redis.call('ZADD', KEYS[5], now + tol, id)
  redis.call('SADD', KEYS[3], id)
  redis.call('SADD', KEYS[6], id)
  redis.call('HSET', job, 'state', 'leased', 'worker', worker, 'token', token,
    'leased', now, 'updated', now, 'cancel', '0')
  if kind == 'agent' then redis.call('HINCRBY', KEYS[10], campaign, 1) end
  redis.call('XADD', KEYS[9], 'MAXLEN', '~', 100000, '*',
    'type', 'lease.granted', 'by', 'worker:' .. worker, 'job', id, 'token', token, 'worker', worker)
  out[#out + 1] = id
  out[#out + 1] = token
end
return out
