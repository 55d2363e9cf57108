-- heartbeat: renew a worker's alive key and each lease it names under a matching token.
-- KEYS[1] worker hash  KEYS[2] worker alive  KEYS[3] deadlines  KEYS[4] daemon hash
-- KEYS[5 + 2(i-1)] lease of job i   KEYS[6 + 2(i-1)] job hash of job i
-- ARGV[1] grace (ms)  ARGV[2] toleration (ms)  ARGV[3] sample (JSON)  ARGV[4] n jobs
-- ARGV[5 .. 4+n] tokens   ARGV[5+n .. 4+2n] job ids
-- Reply: {now_ms, status_1, ..., status_n}; status is 'ok', 'cancel' (stop it) or 'lost'.
-- After the daemon's own absence (its last pass older than grace: the machine slept, the daemon was stopped or
-- paused) a lease key that Redis expired meanwhile is not lost: the pass re-arms every lease from the job's
-- token when it runs again, and a heartbeat that arrives first re-arms its own the same way (else it would
-- hear `lost` and stop a job the pass is about to keep).
-- Error PILOOP_UNKNOWN_WORKER when the worker is not registered (it must register again).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('PILOOP_UNKNOWN_WORKER register again')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tol = tonumber(ARGV[2])
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
redis.call('HSET', KEYS[1], 'seen', now, 'sample', ARGV[3])
local n = tonumber(ARGV[4])
local last = tonumber(redis.call('HGET', KEYS[4], 'last_pass') or '0')
local absent = last > 0 and now - last > tonumber(ARGV[1])
local out = {now}
for i = 1, n do
  local lease, job = KEYS[5 + 2 * (i - 1)], KEYS[6 + 2 * (i - 1)]
  local token, id = ARGV[4 + i], ARGV[4 + n + i]
  if absent and redis.call('EXISTS', lease) == 0 then
    local f = redis.call('HMGET', job, 'token', 'state')
    if f[1] == token and (f[2] == 'leased' or f[2] == 'running') then
      redis.call('SET', lease, token, 'PX', tol)
    end
  end
  if redis.call('GET', lease) == token then
    redis.call('PEXPIRE', lease, tol)
    redis.call('ZADD', KEYS[3], now + tol, id)
    local st = redis.call('HMGET', job, 'state', 'cancel')
    if st[1] == 'leased' then
      redis.call('HSET', job, 'state', 'running', 'started', now, 'updated', now)
    end
    if st[2] == '1' then out[#out + 1] = 'cancel' else out[#out + 1] = 'ok' end
  else
    out[#out + 1] = 'lost'
  end
end
return out
