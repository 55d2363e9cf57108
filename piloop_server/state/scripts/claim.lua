-- claim: lease up to N jobs of one kind to a worker, each under a new fencing token.
-- @call KEYS 14 ARGV 11+n
-- KEYS[1] worker hash  KEYS[2] worker alive  KEYS[3] worker leases (this kind)
-- KEYS[4] queue (pool, kind)  KEYS[5] deadlines  KEYS[6] active (pool, kind)  KEYS[7] token seq
-- KEYS[8] generation  KEYS[9] events  KEYS[10] campaign live  KEYS[11] daemon hash
-- KEYS[12] worker leases (the other kind)  KEYS[13] ended  KEYS[14] expiring
-- ARGV[1] key prefix (job hashes are found by id here)  ARGV[2] worker  ARGV[3] kind
-- ARGV[4] slots of this kind  ARGV[5] worker image  ARGV[6] toleration (ms)  ARGV[7] most to take
-- ARGV[8] how deep to scan the queue  ARGV[9] the worker's room (MiB; -1: grants not checked)
-- ARGV[10] the pool's grant for a job that asks for none (MiB; 0: none)
-- ARGV[11] the lease history a job keeps  ARGV[12..11+most] a random part for each token (hex, >= 128 bits)
-- Memory: a job's grant is its hash's `grant_mb` (its spec's `memory_mb`, read once, or raised after an
-- out-of-memory attempt), else the pool's; it is leased only when it fits in the room beside the grants of
-- every lease the worker holds (`granted_mb` of each). A job without a grant counts 0 (limited to the room).
-- Order: the queue's scores (include/timing.lua: priority, then FIFO). A candidate whose expiry has come ends
-- `expired` here (include/expiry.lua), never leased late; a job's first lease removes its expiry.
-- A token is `<generation><counter, 12 digits>.<random>`: the first part is the fencing order (one INCR, so it
-- only grows), the random part makes it unguessable; it is compared whole. The job records the worker's owner (the
-- token its name is bound to, register.lua): a lease call under that name by another token is foreign.
-- Reply: {'ok', id1, token1, id2, token2, ...} or {'none', reason}; reasons: recovering,
-- unreachable, draining, slots, nothing, image, memory (no candidate's grant fits).
-- Error PILOOP_NO_GENERATION when the generation marker is missing (Redis lost its data).
-- @include clock
-- @include job_fields
-- @include events
-- @include expiry
local now = clock_ms()
local hold = tonumber(redis.call('HGET', KEYS[11], 'hold_until') or '0')
if hold > now then return {'none', 'recovering'} end
if redis.call('EXISTS', KEYS[2]) == 0 then return {'none', 'unreachable'} end
if redis.call('HGET', KEYS[1], 'draining') == '1' then return {'none', 'draining'} end
local free = tonumber(ARGV[4]) - redis.call('SCARD', KEYS[3])
if free <= 0 then return {'none', 'slots'} end
local gen = redis.call('GET', KEYS[8])
if not gen then return redis.error_reply('PILOOP_NO_GENERATION the generation marker is gone') end
local want = math.min(free, tonumber(ARGV[7]))
if want <= 0 then return {'none', 'slots'} end  -- nothing asked for (and a page of 0 would read the whole queue)
local prefix, worker, kind, image = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
local owner = redis.call('HGET', KEYS[1], 'owner') or ''  -- the lease is bound to it (include/lease_check.lua)
local tol = tonumber(ARGV[6])
local room, default_mb = tonumber(ARGV[9] or '-1'), tonumber(ARGV[10] or '0')
if room >= 0 then redis.call('HSET', KEYS[1], 'room_mb', room) end
local depth = tonumber(ARGV[8])
local history_keep = tonumber(ARGV[11])
-- agents: every job within the depth (they are picked by campaign); evaluations: as many as are wanted, then
-- pages of 16 more only while the jobs wanted are not all found (each job read is ~7 us of Redis)
local page = kind == 'agent' and depth or math.min(depth, want)
local ids = redis.call('ZRANGE', KEYS[4], 0, page - 1)
if #ids == 0 then return {'none', 'nothing'} end

-- What the worker has granted already, from its leases of both kinds (derived, never a counter to drift).
local granted = 0
if room >= 0 then
  for _, set in ipairs({KEYS[3], KEYS[12]}) do
    for _, id in ipairs(redis.call('SMEMBERS', set)) do
      granted = granted + (tonumber(redis.call('HGET', prefix .. 'job:' .. id, JF.granted_mb)) or 0)
    end
  end
end
local function fits(grant)
  return room < 0 or granted + grant <= room
end

-- A queued job this worker may run (its image is empty or the worker's), with its grant; nil when it may not,
-- and nil, true when its expiry had come: it ended `expired` and left the queue.
local expired = 0
local function candidate(id)
  local job = prefix .. 'job:' .. id
  local f = redis.call('HMGET', job, JF.image, JF.campaign, JF.grant_mb, JF.expires)
  if f[4] and tonumber(f[4]) and tonumber(f[4]) <= now and
      expire_unstarted(job, KEYS[4], KEYS[13], KEYS[9], KEYS[14], nil, id, now, 'worker:' .. worker) then
    expired = expired + 1
    return nil, true
  end
  if not (f[1] == false or f[1] == '' or f[1] == image) then return nil end
  local grant = tonumber(f[3])
  if grant == nil then
    -- read the spec's grant once; later claims (and a raise after an OOM) use the field
    local ok, spec = pcall(cjson.decode, redis.call('HGET', job, JF.spec) or '{}')
    grant = ok and type(spec) == 'table' and tonumber(spec.memory_mb) or 0
    redis.call('HSET', job, JF.grant_mb, grant)
  end
  if grant <= 0 then grant = default_mb end
  return {id = id, campaign = f[2] or '', grant = grant, expires = f[4] and true or false}
end

local out = {'ok'}
-- the job's last leases, this one's last (a late call from an earlier holder is then known as its own: stale)
local function remember(job, entry)
  local past = {}
  for e in string.gmatch(redis.call('HGET', job, JF.history) or '', '%S+') do past[#past + 1] = e end
  past[#past + 1] = entry
  local from = math.max(1, #past - history_keep + 1)
  return table.concat(past, ' ', from, #past)
end
local function lease(c)
  granted = granted + c.grant
  local n = (#out - 1) / 2 + 1
  local token = string.format('%d%012d', tonumber(gen), redis.call('INCR', KEYS[7])) .. '.' .. ARGV[11 + n]
  local job = prefix .. 'job:' .. c.id
  redis.call('ZREM', KEYS[4], c.id)
  redis.call('SET', prefix .. 'lease:' .. c.id, token, 'PX', tol)
  redis.call('ZADD', KEYS[5], now + tol, c.id)
  redis.call('SADD', KEYS[3], c.id)
  redis.call('SADD', KEYS[6], c.id)
  redis.call('HSET', job, JF.state, 'leased', JF.worker, worker, JF.token, token, JF.leased, now, JF.updated, now,
    JF.cancel, '0', JF.granted_mb, c.grant, JF.history, remember(job, worker .. '/' .. token), JF.owner, owner)
  if c.expires then
    redis.call('HDEL', job, JF.expires)  -- it started: never expired now, whatever becomes of this lease
    redis.call('ZREM', KEYS[14], c.id)
  end
  if kind == 'agent' then redis.call('HINCRBY', KEYS[10], c.campaign, 1) end
  emit(KEYS[9], 'lease.granted', 'worker:' .. worker, 'job', c.id, 'token', token, 'worker', worker)
  out[#out + 1] = c.id
  out[#out + 1] = token
end

local any = false
if kind == 'agent' then
  -- the campaign with the fewest live agents, ties to the oldest job
  local cands = {}
  for _, id in ipairs(ids) do
    local c = candidate(id)
    if c then cands[#cands + 1] = c end
  end
  any = #cands > 0
  local taken = {}
  for _ = 1, want do
    local pick, best = nil, nil
    for i, c in ipairs(cands) do
      if not taken[i] and fits(c.grant) then
        local live = tonumber(redis.call('HGET', KEYS[10], c.campaign) or '0')
        if best == nil or live < best then best, pick = live, i end
      end
    end
    if pick == nil then break end
    taken[pick] = true
    lease(cands[pick])
  end
else
  -- the oldest jobs that fit, in order (a grant that did not fit never fits later in this call: what is granted
  -- only grows); a page leased from the queue's head moves the rest up, so the next page starts at the kept ones
  local seen, kept = 0, 0
  while true do
    for _, id in ipairs(ids) do
      seen = seen + 1
      local c, gone = candidate(id)
      if c then any = true end
      if c and fits(c.grant) then
        lease(c)
        if (#out - 1) / 2 >= want then break end
      elseif not gone then
        kept = kept + 1
      end
    end
    if (#out - 1) / 2 >= want or seen >= depth or #ids < page then break end
    page = math.min(math.max(want, 16), depth - seen)
    ids = redis.call('ZRANGE', KEYS[4], kept, kept + page - 1)
    if #ids == 0 then break end
  end
end
if not any then return {'none', expired > 0 and 'nothing' or 'image'} end
if #out == 1 then return {'none', 'memory'} end
return out
