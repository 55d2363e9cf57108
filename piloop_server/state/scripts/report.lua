-- report: holders finish their leases, n reports in one call, each idempotent by its report id.
-- @call KEYS 7+6n ARGV 4+18n
-- The call's KEYS: 7 shared, then 6 for each report; its ARGV: 4 shared, then 18 for each report. Each report is
-- run as if alone, in order, with the KEYS and ARGV below (K[i] and A[i] in `report_one`):
-- shared: KEYS[4] deadlines  KEYS[6] campaign live  KEYS[7] events  KEYS[9] daemon hash  KEYS[10] campaign jobs
-- to integrate  KEYS[12] delayed (failed jobs waiting out their backoff)  KEYS[13] ended, in this order first;
-- ARGV[7] max_lost  ARGV[9] grace (ms)  ARGV[10] toleration (ms), then the most bytes a report's inline outputs
-- may hold in all (bytecaps.INLINE_MAX_BYTES), in this order first
-- each report's: KEYS[1] lease  KEYS[2] job hash  KEYS[3] worker leases (kind)  KEYS[5] active (pool, kind)
-- KEYS[8] queue (pool, kind)  KEYS[11] worker hash, in this order; ARGV[1..6], ARGV[8], ARGV[11..21], in order
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] outcome: succeeded | failed |
-- cancelled | fenced (the worker stopped it at its deadline, or lost it) | lost (its blobs are missing)
-- ARGV[5] result (JSON: exit, usage, log, outputs)  ARGV[6] the report id  ARGV[7] max_lost
-- ARGV[8] reason  ARGV[9] grace (ms)  ARGV[10] toleration (ms)  ARGV[11] 1 when the run ran out of memory
-- ARGV[12..17] the job's retry policy, from its spec and its pool (state/records/lease.py RetryPolicy): max_attempts,
-- backoff (ms), backoff factor, the longest backoff (ms), memory growth, the cap on a raised grant (MiB; 0: the
-- worker's room)
-- ARGV[18] what a stale report is kept as (JSON: its size and the CAS addresses it names, never its body)
-- ARGV[19] the spec's retry_on (qualified exception class names, space-separated; empty: any failure retries)
-- ARGV[20] the classes of the exception the task raised (its MRO, qualified, space-separated; empty: none)
-- ARGV[21] the calling token's identity (lease_check's owner)
-- A failed run is an attempt. Out of memory with a grant below its cap: queued again at once with grant × growth
-- (capped), not counted against max_attempts. Otherwise, with attempts left, it waits backoff × factor^(n-1) (at
-- most the longest) in `delayed`, still `queued`; the pass's due.lua puts it back in its queue. With a retry_on,
-- only an attempt whose exception is (a subclass of) one of its classes is retried: any other failure ends the job.
-- Cancel wins: a job whose cancel was asked for ends `cancelled` whatever the run's outcome (it may have exited on
-- its own once its relayed calls were refused, before its worker heard of the cancel); the result is kept.
-- A result's inline outputs (name -> base64, a task's small result kept with the job instead of the CAS) are checked:
-- over the cap in all, or a name that is also a CAS address in its outputs, and the report is refused, nothing
-- changed: its answer is {"error":"too_large"|"bad_request","message":...}, never kept.
-- Reply: one answer a report, in order: the answer as JSON, the same for every copy of one report id:
-- {"answer":"accepted","state":...} or {"answer":"stale"} (a late report: kept as one `lease.stale_report` event).
-- A report from a worker that never held the lease under that token answers stale too, but is not kept
-- (lease_check leaves `lease.foreign_token`).
-- The answer is kept in the job's hash, field `answer:<token>` = `<report id> <answer>` (the accepted one, else
-- the first given under that token): a copy of the report (the same id, in this call or a later one) gets it again,
-- and it goes with the job (retention, prune.lua). Only an answer under the job's current token is kept (the one
-- lease a later report could still change): a stale report under an older token is stale again at every copy.
-- @include clock
-- @include lease_check
-- @include finish
local INLINE_MOST = tonumber(ARGV[4])

-- why a result's inline outputs are refused ('' when they are not); its error code
local function inline_refusal(result)
  if not string.find(result, '"inline_outputs"', 1, true) then return '' end
  local ok, r = pcall(cjson.decode, result)
  if not ok or type(r) ~= 'table' or type(r.inline_outputs) ~= 'table' then return '' end
  local total = 0
  for name, data in pairs(r.inline_outputs) do
    if type(data) ~= 'string' then return 'bad_request', 'inline output ' .. tostring(name) .. ': not base64' end
    if type(r.outputs) == 'table' and r.outputs[name] ~= nil then
      return 'bad_request', 'output ' .. name .. ' is both inline and a CAS address: give one'
    end
    local pad = select(2, string.gsub(string.sub(data, -2), '=', ''))
    total = total + math.floor(#data * 3 / 4) - pad
  end
  if total > INLINE_MOST then
    return 'too_large', 'inline outputs of ' .. total .. ' bytes, over ' .. INLINE_MOST ..
      ' (bytecaps.INLINE_MAX_BYTES): put them in the CAS and name their addresses'
  end
  return ''
end

local function report_one(K, A)
  local id, token, worker, outcome, report_id = A[1], A[2], A[3], A[4], A[6]
  local answer_field = JF_ANSWER .. token
  local prev = redis.call('HGET', K[2], answer_field)
  if prev then
    local sep = string.find(prev, ' ', 1, true)
    if sep and string.sub(prev, 1, sep - 1) == report_id then return string.sub(prev, sep + 1) end
  end
  local code, why = inline_refusal(A[5])
  if code ~= '' then return cjson.encode({error = code, message = 'job ' .. id .. ': ' .. why}) end
  local now = clock_ms()
  local last = tonumber(redis.call('HGET', K[9], 'last_pass') or '0')
  local rearm = 0
  if last > 0 and now - last > tonumber(A[9]) then rearm = tonumber(A[10]) end
  local held = lease_check(K[1], K[2], K[7], id, token, worker, A[21], rearm)
  if held == 'foreign' then return cjson.encode({answer = 'stale'}) end
  local answer
  if held == 'stale' then
    answer = cjson.encode({answer = 'stale'})
    emit(K[7], 'lease.stale_report', 'worker:' .. worker, 'job', id, 'token', token, 'outcome', outcome,
      'result', A[18])
  else
    local f = redis.call('HMGET', K[2], JF.kind, JF.campaign, JF.score, JF.lost, JF.cancel, JF.attempts,
      JF.raises, JF.granted_mb)
    local kind = f[1]
    redis.call('DEL', K[1])
    redis.call('ZREM', K[4], id)
    redis.call('SREM', K[3], id)
    redis.call('SREM', K[5], id)
    if kind == 'agent' then redis.call('HINCRBY', K[6], f[2] or '', -1) end
    local state = outcome
    local reason = A[8]
    if outcome == 'fenced' then
      -- lost for its kind, never a failed attempt
      if kind == 'agent' then
        state = 'worker_lost'
      else
        local lost = tonumber(f[4] or '0') + 1
        redis.call('HSET', K[2], JF.lost, lost)
        if lost >= tonumber(A[7]) then
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
      local function num(v) return tonumber(v) or 0 end
      local max_attempts, backoff, factor, longest = num(A[12]), num(A[13]), num(A[14]), num(A[15])
      local growth, cap = num(A[16]), num(A[17])
      local attempts, raises, granted = num(f[6]) + 1, num(f[7]), num(f[8])
      if A[11] == '1' and granted > 0 then
        if cap <= 0 then cap = num(redis.call('HGET', K[11], 'room_mb')) end
        local raised = math.min(math.ceil(granted * growth), cap)
        if raised > granted then
          grant, delay, raises = raised, 0, raises + 1
          reason = reason .. ' at ' .. granted .. ' MiB; the next attempt is granted ' .. raised .. ' MiB'
        else
          reason = reason .. ' at ' .. granted .. ' MiB, its cap'
        end
      end
      local counted = attempts - raises
      local retryable = A[19] == ''
      if not retryable then
        for class in string.gmatch(A[20], '%S+') do
          if string.find(' ' .. A[19] .. ' ', ' ' .. class .. ' ', 1, true) then retryable = true end
        end
        if not retryable and delay == nil and counted < max_attempts then
          local raised = string.match(A[20], '%S+')
          reason = reason .. '; not retried: ' .. (raised and (raised .. ' is not') or 'it raised nothing') ..
            ' in its retry_on'
        end
      end
      if delay == nil and counted < max_attempts and retryable then
        delay = math.floor(math.min(backoff * factor ^ (counted - 1), longest))
        reason = reason .. '; attempt ' .. counted .. ' of ' .. max_attempts .. ' failed'
      end
      if delay ~= nil then
        state, etype = 'queued', 'job.retrying'
        redis.call('HSET', K[2], JF.state, 'queued', JF.worker, '', JF.token, '', JF.result, A[5],
          JF.reason, reason, JF.attempts, attempts, JF.raises, raises, JF.lost, 0, JF.updated, now)
        if grant then redis.call('HSET', K[2], JF.grant_mb, grant) end
        if delay > 0 then
          redis.call('ZADD', K[12], now + delay, id)
          redis.call('HSET', K[2], JF.retry_at, now + delay)
        else
          redis.call('ZADD', K[8], f[3], id)
        end
      end
    end
    if etype == 'job.retrying' then
      emit(K[7], etype, 'worker:' .. worker, 'job', id, 'token', token, 'reason', reason, 'delay_ms', delay,
        'memory_mb', grant or '')
    elseif state == 'queued' then
      redis.call('ZADD', K[8], f[3], id)
      redis.call('HSET', K[2], JF.state, 'queued', JF.worker, '', JF.token, '', JF.updated, now)
    else
      finish(K[2], K[13], id, state, reason, now, JF.result, A[5])
      if state == 'succeeded' or state == 'failed' or state == 'cancelled' then
        redis.call('HINCRBY', K[2], JF.attempts, 1)
        redis.call('HSET', K[2], JF.lost, 0)
      end
    end
    if state == 'succeeded' and (f[2] or '') ~= '' then
      -- the campaign's side of it (an agent's commits, an evaluation's score) is done off the pass, by id
      redis.call('SADD', K[10], id)
    end
    answer = cjson.encode({answer = 'accepted', state = state})
    if etype ~= 'job.retrying' then
      emit(K[7], etype, 'worker:' .. worker, 'job', id, 'token', token, 'reason', reason)
    end
  end
  if held == 'ok' then
    redis.call('HSET', K[2], answer_field, report_id .. ' ' .. answer)
  elseif redis.call('HGET', K[2], JF.token) == token then
    redis.call('HSETNX', K[2], answer_field, report_id .. ' ' .. answer)
  end
  return answer
end

local shared_keys, shared_args = 7, 4
local answers = {}
local n = (#KEYS - shared_keys) / 6
for i = 0, n - 1 do
  local k, a = shared_keys + 6 * i, shared_args + 18 * i
  local K = {KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[1], KEYS[k + 4], KEYS[2], KEYS[3], KEYS[k + 5], KEYS[4],
    KEYS[5], KEYS[k + 6], KEYS[6], KEYS[7]}
  local A = {ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[1], ARGV[a + 7],
    ARGV[2], ARGV[3]}
  for j = 11, 21 do A[j] = ARGV[a + j - 3] end
  answers[#answers + 1] = report_one(K, A)
end
return answers
