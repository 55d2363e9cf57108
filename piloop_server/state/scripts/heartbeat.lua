-- heartbeat: for each worker named, renew its alive key and each lease it names under a matching token. The
-- heartbeats that reach the server within a few ms of each other share one call (`api/beats.py`).
-- KEYS[1] deadlines  KEYS[2] daemon hash; then for each worker: its hash, its alive key, and for each job it names
-- the job's lease and the job's hash.
-- ARGV[1] grace (ms)  ARGV[2] toleration (ms)  ARGV[3] m workers; then for each worker: its sample (JSON), n jobs,
-- the n tokens, the n job ids.
-- Reply: {now_ms, one answer a worker}: {1, status_1, ..., status_n}, a status being 'ok', 'cancel' (stop it) or
-- 'lost'; or {0} for a worker that is not registered (it must register again), whose keys are left as they are.
-- After the daemon's own absence (its last pass older than grace: the machine slept, the daemon was stopped or
-- paused) a lease key that Redis expired meanwhile is not lost: the pass re-arms every lease from the job's
-- token when it runs again, and a heartbeat that arrives first re-arms its own the same way (else it would
-- hear `lost` and stop a job the pass is about to keep).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local grace, tol = tonumber(ARGV[1]), tonumber(ARGV[2])
local last = tonumber(redis.call('HGET', KEYS[2], 'last_pass') or '0')
local absent = last > 0 and now - last > grace
local out = {now}
local k, a = 3, 4  -- the first key and argument of the worker at hand
for _ = 1, tonumber(ARGV[3]) do
  local n = tonumber(ARGV[a + 1])
  local answer = {0}
  if redis.call('EXISTS', KEYS[k]) == 1 then
    answer = {1}
    redis.call('SET', KEYS[k + 1], '1', 'PX', grace)
    redis.call('HSET', KEYS[k], 'seen', now, 'sample', ARGV[a])
    for i = 1, n do
      local lease, job = KEYS[k + 2 * i], KEYS[k + 2 * i + 1]
      local token, id = ARGV[a + 1 + i], ARGV[a + 1 + n + i]
      if absent and redis.call('EXISTS', lease) == 0 then
        local f = redis.call('HMGET', job, 'token', 'state')
        if f[1] == token and (f[2] == 'leased' or f[2] == 'running') then
          redis.call('SET', lease, token, 'PX', tol)
        end
      end
      if redis.call('GET', lease) == token then
        redis.call('PEXPIRE', lease, tol)
        redis.call('ZADD', KEYS[1], now + tol, id)
        local st = redis.call('HMGET', job, 'state', 'cancel')
        if st[1] == 'leased' then
          redis.call('HSET', job, 'state', 'running', 'started', now, 'updated', now)
        end
        if st[2] == '1' then answer[#answer + 1] = 'cancel' else answer[#answer + 1] = 'ok' end
      else
        answer[#answer + 1] = 'lost'
      end
    end
  end
  out[#out + 1] = answer
  k = k + 2 + 2 * n
  a = a + 2 + 2 * n
end
return out
