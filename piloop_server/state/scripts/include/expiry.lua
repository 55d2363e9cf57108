-- expiry (included): the one way a queued job with an expiry that no lease took in time ends `expired`, where a
-- claim meets it (claim.lua: it can never start late) and in the pass (unstarted.lua: it ends with no worker).
-- expire_unstarted(job key, queue key, ended key, events key, expiring key, delayed key or nil, id, now, by)
-- Only a job that is `queued` and still has its `expires` field (a lease removes it: a job that started once is
-- never expired) whose time has come; returns true when it ended it.
-- @include job_fields
-- @include finish
-- @include events
local function expire_unstarted(job_key, queue_key, ended_key, events_key, expiring_key, delayed_key, id, now, by)
  local f = redis.call('HMGET', job_key, JF.state, JF.expires, JF.created)
  local at = tonumber(f[2] or '')
  if f[1] ~= 'queued' or at == nil or at > now then return false end
  redis.call('ZREM', queue_key, id)
  redis.call('ZREM', expiring_key, id)
  if delayed_key then redis.call('ZREM', delayed_key, id) end
  redis.call('HDEL', job_key, JF.retry_at, JF.not_before)
  local after = string.format('%.1f', (at - (tonumber(f[3] or '') or at)) / 1000)
  finish(job_key, ended_key, id, 'expired', 'expired: not started within ' .. after .. ' s of being queued', now)
  emit(events_key, 'job.expired', by, 'job', id)
  return true
end
