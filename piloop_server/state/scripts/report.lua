-- report: finish a lease under its token; idempotent by report id.
-- KEYS[1] report answer  KEYS[2] lease  KEYS[3] job hash  KEYS[4] worker leases (kind)
-- KEYS[5] deadlines  KEYS[6] active (pool, kind)  KEYS[7] campaign live  KEYS[8] events
-- KEYS[9] queue (pool, kind)  KEYS[10] daemon hash  KEYS[11] campaign jobs to integrate
-- KEYS[12] worker hash  KEYS[13] delayed (failed jobs waiting out their backoff)
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] outcome: succeeded | failed |
-- cancelled | fenced (the worker stopped it at its deadline) | lost (its blobs are missing)
-- ARGV[5] result (JSON: exit, usage, log, outputs)  ARGV[6] answer TTL (s)  ARGV[7] max_lost
-- ARGV[8] reason  ARGV[9] grace (ms)  ARGV[10] toleration (ms)
-- ARGV[11] 1 when the run ran out of memory  ARGV[12] the pool's cap on a raised grant (MiB; 0: none)
-- A failed run is an attempt. Out of memory with a grant below its cap (the spec's `memory_max_mb`, else the
-- pool's, else this worker's room): queued again at once with grant × `memory_growth` (capped), not counted
-- against `max_attempts`. Otherwise, with attempts left (`max_attempts` in the spec), it waits
-- `backoff_seconds` × `backoff_factor`^(n-1) (at most an hour) in `delayed`, still `queued`; the pass's
-- due.lua puts it back in its queue. A cancelled job is never retried.
-- A job whose cancel was asked for ends `cancelled` whatever the run's outcome (it may have exited on its
-- own once its relayed calls were refused, before its worker heard of the cancel); the result is kept.
-- After the daemon's own absence (its last pass older than grace) a lease that Redis expired meanwhile still
-- holds while the job names this token, as the pass would re-arm it (see heartbeat.lua).
-- Reply: the answer as JSON, the same for every copy of one report id:
-- {"answer":"accepted","state":...} or {"answer":"stale"}; a retried job's state is `queued`.
local prev = redis.call('GET', KEYS[1])
if prev then return prev end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id, token, worker, outcome = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local answer
local last = tonumber(redis.call('HGET', KEYS[10], 'last_pass') or '0')
if last > 0 and now - last > tonumber(ARGV[9]) and redis.call('EXISTS', KEYS[2]) == 0 then
  local f = redis.call('HMGET', KEYS[3], 'token', 'state')
  if f[1] == token and (f[2] == 'leased' or f[2] == 'running') then
    redis.call('SET', KEYS[2], token, 'PX', ARGV[10])
  end
end
if redis.call('GET', KEYS[2]) ~= token then
  answer = cjson.encode({answer = 'stale'})
  redis.call('XADD', KEYS[8], 'MAXLEN', '~', 100000, '*',
    'type', 'lease.stale_report', 'by', 'worker:' .. worker, 'job', id, 'token', token,
    'outcome', outcome, 'result', ARGV[5])
else
  local f = redis.call('HMGET', KEYS[3], 'kind', 'campaign', 'score', 'lost', 'cancel', 'spec', 'attempts',
    'raises', 'granted_mb')
  local kind = f[1]
  redis.call('DEL', KEYS[2])
  redis.call('ZREM', KEYS[5], id)
  redis.call('SREM', KEYS[4], id)
  redis.call('SREM', KEYS[6], id)
  if kind == 'agent' then redis.call('HINCRBY', KEYS[7], f[2] or '', -1) end
  local state = outcome
  local reason = ARGV[8]
  if outcome == 'fenced' then
    -- lost for its kind, never a failed attempt
    if kind == 'agent' then
      state = 'worker_lost'
    else
      local lost = tonumber(f[4] or '0') + 1
      redis.call('HSET', KEYS[3], 'lost', lost)
      if lost >= tonumber(ARGV[7]) then
        state = 'lost'
        reason = 'lost ' .. lost .. ' times in a row'
      else
        state = 'queued'
      end
    end
  end
  if f[5] == '1' and outcome ~= 'lost' then
    state = 'cancelled'
    reason = 'cancelled'
  end
  local etype = 'job.' .. state
  local delay, grant = nil, nil
  if state == 'failed' then
    local ok, spec = pcall(cjson.decode, f[6] or '{}')
    if not ok or type(spec) ~= 'table' then spec = {} end
    local function num(v, d) local n = tonumber(v); if n == nil then return d end return n end
    local attempts, raises, granted = num(f[7], 0) + 1, num(f[8], 0), num(f[9], 0)
    if ARGV[11] == '1' and granted > 0 then
      local cap = num(spec.memory_max_mb, 0)
      if cap <= 0 then cap = num(ARGV[12], 0) end
      if cap <= 0 then cap = num(redis.call('HGET', KEYS[12], 'room_mb'), 0) end
      local raised = math.min(math.ceil(granted * num(spec.memory_growth, 1.5)), cap)
      if raised > granted then
        grant, delay, raises = raised, 0, raises + 1
        reason = reason .. ' at ' .. granted .. ' MiB; the next attempt is granted ' .. raised .. ' MiB'
      else
        reason = reason .. ' at ' .. granted .. ' MiB, its cap'
      end
    end
    local counted = attempts - raises
    if delay == nil and counted < num(spec.max_attempts, 1) then
      delay = math.floor(math.min(num(spec.backoff_seconds, 10) * num(spec.backoff_factor, 2) ^ (counted - 1),
        3600) * 1000)
      reason = reason .. '; attempt ' .. counted .. ' of ' .. num(spec.max_attempts, 1) .. ' failed'
    end
    if delay ~= nil then
      state, etype = 'queued', 'job.retrying'
      redis.call('HSET', KEYS[3], 'state', 'queued', 'worker', '', 'token', '', 'result', ARGV[5],
        'reason', reason, 'attempts', attempts, 'raises', raises, 'lost', 0, 'updated', now)
      if grant then redis.call('HSET', KEYS[3], 'grant_mb', grant) end
      if delay > 0 then
        redis.call('ZADD', KEYS[13], now + delay, id)
        redis.call('HSET', KEYS[3], 'retry_at', now + delay)
      else
        redis.call('ZADD', KEYS[9], f[3], id)
      end
    end
  end
  if etype == 'job.retrying' then
    redis.call('XADD', KEYS[8], 'MAXLEN', '~', 100000, '*', 'type', etype, 'by', 'worker:' .. worker, 'job', id,
      'token', token, 'reason', reason, 'delay_ms', delay, 'memory_mb', grant or '')
  elseif state == 'queued' then
    redis.call('ZADD', KEYS[9], f[3], id)
    redis.call('HSET', KEYS[3], 'state', 'queued', 'worker', '', 'token', '', 'updated', now)
  else
    redis.call('HSET', KEYS[3], 'state', state, 'result', ARGV[5], 'reason', reason,
      'ended', now, 'updated', now)
    if state == 'succeeded' or state == 'failed' or state == 'cancelled' then
      redis.call('HINCRBY', KEYS[3], 'attempts', 1)
      redis.call('HSET', KEYS[3], 'lost', 0)
    end
  end
  if state == 'succeeded' and (f[2] or '') ~= '' then
    -- the campaign's side of it (an agent's commits, an evaluation's score) is done off the pass, by id
    redis.call('SADD', KEYS[11], id)
  end
  answer = cjson.encode({answer = 'accepted', state = state})
  if etype ~= 'job.retrying' then
    redis.call('XADD', KEYS[8], 'MAXLEN', '~', 100000, '*',
      'type', etype, 'by', 'worker:' .. worker, 'job', id, 'token', token, 'reason', reason)
  end
end
redis.call('SET', KEYS[1], answer, 'EX', ARGV[6])
return answer
