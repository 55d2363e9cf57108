-- heartbeat: for each worker named, renew its alive key and each lease it names that it holds (lease_check).
-- @call KEYS 3+2n ARGV 3+n
-- KEYS[1] deadlines  KEYS[2] daemon hash  KEYS[3] events; then for each worker: its hash, its alive key, and for
-- each job it names the job's lease and the job's hash.
-- ARGV[1] grace (ms)  ARGV[2] toleration (ms)  ARGV[3] m workers; then for each worker: its sample (JSON), n jobs,
-- the n tokens, the n job ids, the identity of the token that calls for it (lease_check's owner).
-- Reply: {now_ms, one answer a worker}: {1, status_1, ..., status_n}, a status being 'ok', 'cancel' (stop it) or
-- 'lost' (stale or foreign: stop it); or {0} for a worker that is not registered (it must register again), whose
-- keys are left as they are; or {2} for a worker whose name is bound to another token (the register's owner):
-- nothing of it changes.
-- After the daemon's own absence (its last pass older than grace: the machine slept, the daemon was stopped or
-- paused) a lease key that Redis expired meanwhile is not lost: lease_check re-arms it while the job names this
-- worker and token, as the pass will (else the worker would hear `lost` and stop a job the pass is about to keep).
-- @include clock
-- @include lease_check
local now = clock_ms()
local grace, tol = tonumber(ARGV[1]), tonumber(ARGV[2])
local last = tonumber(redis.call('HGET', KEYS[2], 'last_pass') or '0')
local rearm = 0
if last > 0 and now - last > grace then rearm = tol end
local out = {now}
local k, a = 4, 4  -- the first key and argument of the worker at hand
for _ = 1, tonumber(ARGV[3]) do
  local n = tonumber(ARGV[a + 1])
  local owner = ARGV[a + 2 + 2 * n]
  local answer = {0}
  local bound = redis.call('HGET', KEYS[k], 'owner') or ''
  if bound ~= '' and bound ~= owner then
    answer = {2}
  elseif redis.call('EXISTS', KEYS[k]) == 1 then
    answer = {1}
    local worker = redis.call('HGET', KEYS[k], 'name')
    redis.call('SET', KEYS[k + 1], '1', 'PX', grace)
    redis.call('HSET', KEYS[k], 'seen', now, 'sample', ARGV[a])
    for i = 1, n do
      local lease, job = KEYS[k + 2 * i], KEYS[k + 2 * i + 1]
      local token, id = ARGV[a + 1 + i], ARGV[a + 1 + n + i]
      if lease_check(lease, job, KEYS[3], id, token, worker, owner, rearm) == 'ok' then
        redis.call('PEXPIRE', lease, tol)
        redis.call('ZADD', KEYS[1], now + tol, id)
        local st = redis.call('HMGET', job, JF.state, JF.cancel)
        if st[1] == 'leased' then
          redis.call('HSET', job, JF.state, 'running', JF.started, now, JF.updated, now)
        end
        if st[2] == '1' then answer[#answer + 1] = 'cancel' else answer[#answer + 1] = 'ok' end
      else
        answer[#answer + 1] = 'lost'
      end
    end
  end
  out[#out + 1] = answer
  k = k + 2 + 2 * n
  a = a + 3 + 2 * n
end
return out
