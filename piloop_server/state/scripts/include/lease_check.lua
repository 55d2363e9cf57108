-- lease_check (included): the one check before any change to a lease (renew, report, release, log).
-- lease_check(lease_key, job_key, events_key, id, token, worker, owner, rearm_ms) -> 'ok' | 'stale' | 'foreign'
--   ok       the lease is live under `token`, the job names `worker` as its holder and `owner` (the identity of the
--            token that calls: `token:<name>`, `socket`, `proxy`) as the one its worker's name was bound to when
--            it claimed (a job claimed with no owner recorded takes any);
--   stale    `worker` is not the holder under `token` now, but was once given this token for this job (in the
--            job's lease history), or nobody holds the job: a late copy of its own;
--   foreign  another worker holds the job and `worker` was never given this token, or the holder's name is
--            called by another token than the one that claimed: the call changes nothing and leaves one
--            `lease.foreign_token` event naming both.
-- Tokens are compared whole (their fencing order and their random part).
-- rearm_ms > 0 after the daemon's own absence (its last pass older than grace): a lease key that Redis expired
-- meanwhile still holds while the job names this token and this worker, and is set again for rearm_ms, as the
-- pass would re-arm it when it runs.
-- @include job_fields
-- @include events
local function lease_check(lease_key, job_key, events_key, id, token, worker, owner, rearm_ms)
  local f = redis.call('HMGET', job_key, JF.worker, JF.token, JF.state, JF.history, JF.owner)
  local holder = f[1] or ''
  local bound = f[5] or ''
  if holder == worker and bound ~= '' and bound ~= owner then
    emit(events_key, 'lease.foreign_token', 'worker:' .. worker, 'job', id, 'worker', worker, 'holder', holder,
      'owner', owner)
    return 'foreign'
  end
  if holder == worker and f[2] == token and (f[3] == 'leased' or f[3] == 'running') then
    local live = redis.call('GET', lease_key)
    if live == token then return 'ok' end
    if not live and rearm_ms > 0 then
      redis.call('SET', lease_key, token, 'PX', rearm_ms)
      return 'ok'
    end
    return 'stale'
  end
  if holder == '' or holder == worker then return 'stale' end
  if string.find(' ' .. (f[4] or '') .. ' ', ' ' .. worker .. '/' .. token .. ' ', 1, true) then return 'stale' end
  emit(events_key, 'lease.foreign_token', 'worker:' .. worker, 'job', id, 'worker', worker, 'holder', holder)
  return 'foreign'
end
