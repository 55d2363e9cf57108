-- report: finish a lease under its token; idempotent by report id.
-- KEYS[1] report answer  KEYS[2] lease  KEYS[3] job hash  KEYS[4] worker leases (kind)
-- KEYS[5] deadlines  KEYS[6] active (pool, kind)  KEYS[7] campaign live  KEYS[8] events
-- KEYS[9] queue (pool, kind)  KEYS[10] daemon hash  KEYS[11] campaign jobs to integrate
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] outcome: succeeded | failed |
-- cancelled | fenced (the worker stopped it at its deadline) | lost (its blobs are missing)
-- ARGV[5] result (JSON: exit, usage, log, outputs)  ARGV[6] answer TTL (s)  ARGV[7] max_lost
-- ARGV[8] reason  ARGV[9] grace (ms)  ARGV[10] toleration (ms)
-- A job whose cancel was asked for ends `cancelled` whatever the run's outcome (it may have exited on its
-- own once its relayed calls were refused, before its worker heard of the cancel); the result is kept.
-- After the daemon's own absence (its last pass older than grace) a lease that Redis expired meanwhile still
-- holds while the job names this token, as the pass would re-arm it (see heartbeat.lua).
-- Reply: the answer as JSON, the same for every copy of one report id:
-- {"answer":"accepted","state":...} or {"answer":"stale"}.
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
  local f = redis.call('HMGET', KEYS[3], 'kind', 'campaign', 'score', 'lost', 'cancel')
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
  if state == 'queued' then
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
  redis.call('XADD', KEYS[8], 'MAXLEN', '~', 100000, '*',
    'type', 'job.' .. state, 'by', 'worker:' .. worker, 'job', id, 'token', token, 'reason', reason)
end
redis.call('SET', KEYS[1], answer, 'EX', ARGV[6])
return answer
