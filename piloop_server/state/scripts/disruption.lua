-- disruption: the pass's pool-disruption hold (Kubernetes' full-disruption mode), decided in one script so that two
-- passes at once decide once, and kept in Redis so that a restarted daemon finds each hold where it was.
-- @call KEYS 6 ARGV 10
-- KEYS[1] workers set  KEYS[2] disruption hash  KEYS[3] daemon hash  KEYS[4] tokens  KEYS[5] inbox  KEYS[6] events
-- ARGV[1] key prefix  ARGV[2] fewest workers a held pool has  ARGV[3] the share of them that must be silent
-- (more than)  ARGV[4] the hold's length (ms)  ARGV[5] forget: a silent worker without leases whose last heartbeat
-- is older than this (ms) leaves the workers set  ARGV[6] absent: a gap since the last pass longer than this (ms)
-- is the daemon's own absence  ARGV[7] settle (ms)  ARGV[8] escalation nonce (hex)
-- ARGV[9] now by the daemon's clock (ms), which a token's expiry is set by
-- ARGV[10] forget sooner: a worker that cannot come back (below), with no lease, silent longer than this (ms)
-- ARGV[11] the fencing token  ARGV[12] the event cap
-- What counts: a worker counts in its pool unless it cannot come back: its token is gone (revoked, expired, or no
-- longer in KEYS[4]), it departed (drained, its alive key gone, no lease held) or the server stopped it (its
-- provisioned record is `stopping` or `stopped`). A counted worker without an alive key is silent.
-- A pool of at least ARGV[2] counted workers more than ARGV[3] of which are silent is disrupted. Its hold begins once
-- (`hold:<pool>` = JSON {since_ms, until_ms, silent, total, escalation, ended}) with one inbox item and one
-- `escalation` event; it holds until the pool is no longer disrupted (ended: `pool.disruption_ended`, reason
-- `recovered`) or until `until_ms` (reason `timeout`). A hold that timed out stays, not holding, until the pool is
-- no longer disrupted, so a pool that stays silent is not held again and its leases expire as usual.
-- After the daemon's own absence (the pass that follows re-arms every alive key for grace) no hold begins and none
-- ends `recovered` until `settle_until`: for that long the re-armed keys say nothing of the workers.
-- Reply: {held pools, pools whose hold began, {pool, reason, ...} of holds that ended, workers to forget}.
-- Fenced: the leader lease and the pass's token follow (include/fence.lua).
-- @include fence
-- @include clock
-- @include events
local now = clock_ms()
local prefix = ARGV[1]
local fewest, share, hold_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local forget_ms, absent_ms, settle_ms = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local nonce = ARGV[8]
local clock_ms = tonumber(ARGV[9])

-- a worker's token that no worker can use again: gone, revoked or expired (its record read for this worker only,
-- not every token each pass: a namespace may hold thousands)
local function token_gone(name)
  local raw = redis.call('HGET', KEYS[4], name)
  if not raw then return true end
  local ok, rec = pcall(cjson.decode, raw)
  if not ok or type(rec) ~= 'table' then return false end
  if rec.revoked == true then return true end
  return type(rec.expires_ms) == 'number' and rec.expires_ms < clock_ms
end

local last = tonumber(redis.call('HGET', KEYS[3], 'last_pass') or '0')
if last > 0 and now - last > absent_ms then
  redis.call('HSET', KEYS[2], 'settle_until', now + settle_ms)
end
local settling = now < tonumber(redis.call('HGET', KEYS[2], 'settle_until') or '0')

local per, order, forget = {}, {}, {}
local function pool_of(name)
  if not per[name] then
    per[name] = {0, 0}
    order[#order + 1] = name
  end
  return per[name]
end
for _, w in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local wk = prefix .. 'worker:' .. w
  local f = redis.call('HMGET', wk, 'pool', 'info', 'draining', 'seen', 'registered')
  local alive = redis.call('EXISTS', wk .. ':alive') == 1
  local leases = redis.call('SCARD', wk .. ':leases:agent') + redis.call('SCARD', wk .. ':leases:evaluation')
  if not f[1] then
    if not alive and leases == 0 then forget[#forget + 1] = w end  -- a name without a record
  else
    local token = ''
    if f[2] then
      local ok, info = pcall(cjson.decode, f[2])
      if ok and type(info) == 'table' and type(info.token) == 'string' then token = info.token end
    end
    local provisioned = redis.call('HGET', prefix .. 'provisioned:' .. w, 'state')
    local counts = not (
      (token ~= '' and token_gone(token))
      or (f[3] == '1' and not alive and leases == 0)
      or provisioned == 'stopping' or provisioned == 'stopped')
    local p = pool_of(f[1])
    if counts then
      p[1] = p[1] + 1
      if not alive then p[2] = p[2] + 1 end
    end
    local seen = math.max(tonumber(f[4] or '0') or 0, tonumber(f[5] or '0') or 0)
    local after = counts and forget_ms or tonumber(ARGV[10])
    if not alive and leases == 0 and now - seen > after then forget[#forget + 1] = w end
  end
end
-- pools held before whose workers are all gone end too
for _, field in ipairs(redis.call('HKEYS', KEYS[2])) do
  local pool = string.match(field, '^hold:(.*)$')
  if pool then pool_of(pool) end
end

local held, began, ended = {}, {}, {}
local function finish(pool, hold, reason)
  ended[#ended + 1] = pool
  ended[#ended + 1] = reason
  emit(KEYS[6], 'pool.disruption_ended', 'service:daemon', 'pool', pool, 'reason', reason,
    'since_ms', string.format('%d', hold.since_ms), 'held_ms', string.format('%d', now - hold.since_ms),
    'escalation', hold.escalation)
end
for _, pool in ipairs(order) do
  local total, silent = per[pool][1], per[pool][2]
  local disrupted = total >= fewest and silent > share * total
  local field = 'hold:' .. pool
  local raw = redis.call('HGET', KEYS[2], field)
  local hold = raw and cjson.decode(raw)
  if hold and hold.ended == '' and now >= hold.until_ms then
    hold.ended = 'timeout'
    redis.call('HSET', KEYS[2], field, cjson.encode(hold))
    finish(pool, hold, 'timeout')
  end
  if disrupted then
    if hold and hold.ended == '' then
      held[#held + 1] = pool
    elseif not hold and not settling then
      local id = string.sub(redis.sha1hex(nonce .. ':' .. pool), 1, 12)
      hold = {since_ms = now, until_ms = now + hold_ms, silent = silent, total = total, escalation = id, ended = ''}
      redis.call('HSET', KEYS[2], field, cjson.encode(hold))
      local message = silent .. ' of ' .. total .. ' workers of pool ' .. pool .. ' went silent at once: their ' ..
        'leases are held, not requeued, until the pool is back or for ' .. (hold_ms / 1000) .. ' s at most'
      redis.call('HSET', KEYS[5], id, cjson.encode({id = id, what = 'pool.disrupted', message = message,
        at_ms = now, acked = false, pool = pool, until_ms = hold.until_ms}))
      emit(KEYS[6], 'escalation', 'service:daemon', 'what', 'pool.disrupted', 'message', message, 'escalation', id)
      held[#held + 1] = pool
      began[#began + 1] = pool
    end
  elseif hold then
    if hold.ended == '' and settling then
      held[#held + 1] = pool
    else
      redis.call('HDEL', KEYS[2], field)
      if hold.ended == '' then finish(pool, hold, 'recovered') end
    end
  end
end
return {held, began, ended, forget}
