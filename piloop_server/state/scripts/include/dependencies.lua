-- dependencies (included): the one place a job that waits on its parents (its spec's `after`) is settled.
-- wait_on(prefix, job key, id, spec) adds a new waiting job to each unended parent's `children` set (the pass reads it once
-- the parent has ended); settle(prefix, events key, ended key, id, by, now) decides a waiting job:
--   a parent failed, was cancelled, lost or expired (or is gone): the job ends `cancelled`, "parent <id> <state>";
--   every parent succeeded: the job is queued at its own queue score (its place in line since it was submitted),
--     a chain's input (`pipe`) first filled in with the address of the parent's result (or, for a result kept
--     inline, `inline:<base64>`);
--   else it keeps waiting.  Returns the job's state after (false: no such job).
-- @include finish
-- @include events
local DEPENDENCY_ENDS = {failed = true, cancelled = true, lost = true, worker_lost = true, expired = true}
local PIPE_PLACEHOLDER = 'sha256:' .. string.rep('0', 64)

local ENDED = {succeeded = true, failed = true, cancelled = true, lost = true, worker_lost = true, expired = true}

-- only a parent yet to end gets the set: one that ended (or is gone) is settled by the caller's `settle` at once,
-- and a set made for it would outlive it (the pass read past it already)
local function wait_on(prefix, id, spec)
  for _, p in ipairs(spec.after or {}) do
    local st = redis.call('HGET', prefix .. 'job:' .. p, JF.state)
    if st and not ENDED[st] then redis.call('SADD', prefix .. 'job:' .. p .. ':children', id) end
  end
end

local function settle(prefix, events_key, ended_key, id, by, now)
  local job = prefix .. 'job:' .. id
  local f = redis.call('HMGET', job, JF.state, JF.spec, JF.pool, JF.kind, JF.score)
  if f[1] ~= 'waiting' then return f[1] end
  local raw = f[2]
  local spec = cjson.decode(raw)
  local why, pending = nil, false
  for _, p in ipairs(spec.after or {}) do
    local st = redis.call('HGET', prefix .. 'job:' .. p, JF.state)
    if not st then
      why = 'parent ' .. p .. ' is gone (removed by retention)'
    elseif DEPENDENCY_ENDS[st] then
      why = 'parent ' .. p .. ' ' .. st
    elseif st ~= 'succeeded' then
      pending = true
    end
    if why then break end
  end
  if not why and pending then return 'waiting' end
  if not why and type(spec.pipe) == 'string' then
    local ser = (type(spec.inputs) == 'table' and spec.inputs['parent.json']) and 'json' or 'pickle'
    local result = redis.call('HGET', prefix .. 'job:' .. spec.pipe, JF.result)
    local ok, got = pcall(cjson.decode, result or '')
    local address = ok and type(got) == 'table' and type(got.outputs) == 'table' and got.outputs['result.' .. ser]
    if type(address) ~= 'string' and ok and type(got) == 'table' and type(got.inline_outputs) == 'table' and
        type(got.inline_outputs['result.' .. ser]) == 'string' then
      -- a small result kept with the parent: in its place, `inline:<base64>` (JobSpec takes it as an inline input)
      address = 'inline:' .. got.inline_outputs['result.' .. ser]
    end
    local at = string.find(raw, PIPE_PLACEHOLDER, 1, true)
    if type(address) ~= 'string' or not at then
      why = 'parent ' .. spec.pipe .. ' left no result.' .. ser .. ' to pass on (a chain links tasks)'
    else
      raw = string.sub(raw, 1, at - 1) .. address .. string.sub(raw, at + #PIPE_PLACEHOLDER)
    end
  end
  if why then
    finish(job, ended_key, id, 'cancelled', why, now)
    emit(events_key, 'job.cancelled', by, 'job', id, 'reason', why)
    return 'cancelled'
  end
  redis.call('HSET', job, JF.state, 'queued', JF.spec, raw, JF.updated, now)
  redis.call('ZADD', prefix .. 'queue:' .. f[3] .. ':' .. f[4], f[5], id)
  emit(events_key, 'job.released', by, 'job', id, 'pool', f[3])
  return 'queued'
end
