-- new_job (included): write a queued job's hash, queue it, index it and log `job.queued`.
-- new_job(job key, queue key, jobs index key, events key, now (ms), fields) where fields has id, kind, pool,
-- campaign, image, spec (JSON), by, and optionally parent (the job that queued it).
-- @include job_fields
-- @include events
local function new_job(job_key, queue_key, jobs_key, events_key, now, f)
  redis.call('HSET', job_key,
    JF.id, f.id, JF.kind, f.kind, JF.pool, f.pool, JF.campaign, f.campaign, JF.image, f.image,
    JF.spec, f.spec, JF.state, 'queued', JF.attempts, 0, JF.lost, 0, JF.score, now,
    JF.created, now, JF.updated, now, JF.by, f.by, JF.worker, '', JF.token, '')
  if f.parent then redis.call('HSET', job_key, JF.parent, f.parent) end
  redis.call('ZADD', queue_key, now, f.id)
  redis.call('ZADD', jobs_key, now, f.id)
  if f.parent then
    emit(events_key, 'job.queued', f.by, 'job', f.id, 'pool', f.pool, 'kind', f.kind, 'parent', f.parent)
  else
    emit(events_key, 'job.queued', f.by, 'job', f.id, 'pool', f.pool, 'kind', f.kind)
  end
end
