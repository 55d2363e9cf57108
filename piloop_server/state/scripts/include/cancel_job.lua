-- cancel_job (included): the one way a cancel is asked for. A job still waiting for a lease (`queued`, or
-- `waiting` on its parents) ends `cancelled` at once; a leased or running one gets the cancel flag, which its
-- worker hears at its next heartbeat (and cancel wins over every later outcome).
-- cancel_job(job key, queue key, delayed key, ended key, events key, id, by, reason, now)
--   -> 'cancelled' | 'cancelling' | the state it was in (ended already, or no such job: false)
-- @include finish
-- @include events
local function cancel_job(job_key, queue_key, delayed_key, ended_key, events_key, id, by, reason, now)
  local st = redis.call('HGET', job_key, JF.state)
  if st == 'queued' or st == 'waiting' then
    redis.call('ZREM', queue_key, id)
    redis.call('ZREM', delayed_key, id)
    redis.call('HDEL', job_key, JF.retry_at)
    finish(job_key, ended_key, id, 'cancelled', reason, now)
    emit(events_key, 'job.cancelled', by, 'job', id)
    return 'cancelled'
  elseif st == 'leased' or st == 'running' then
    redis.call('HSET', job_key, JF.cancel, '1', JF.updated, now)
    emit(events_key, 'job.cancel_requested', by, 'job', id)
    return 'cancelling'
  end
  return st
end
