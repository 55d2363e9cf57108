-- new_job (included): write a queued job's hash, queue it, index it and log `job.queued`.
-- new_job(job key, queue key, jobs index key, events key, now (ms), fields) where fields has id, kind, pool,
-- campaign, image, spec (JSON), by, and optionally parent (the job that queued it).
local function new_job(job_key, queue_key, jobs_key, events_key, now, f)
  redis.call('HSET', job_key,
    'id', f.id, 'kind', f.kind, 'pool', f.pool, 'campaign', f.campaign, 'image', f.image,
    'spec', f.spec, 'state', 'queued', 'attempts', 0, 'lost', 0, 'score', now,
    'created', now, 'updated', now, 'by', f.by, 'worker', '', 'token', '')
  if f.parent then redis.call('HSET', job_key, 'parent', f.parent) end
  redis.call('ZADD', queue_key, now, f.id)
  redis.call('ZADD', jobs_key, now, f.id)
  if f.parent then
    redis.call('XADD', events_key, 'MAXLEN', '~', 100000, '*',
      'type', 'job.queued', 'by', f.by, 'job', f.id, 'pool', f.pool, 'kind', f.kind, 'parent', f.parent)
  else
    redis.call('XADD', events_key, 'MAXLEN', '~', 100000, '*',
      'type', 'job.queued', 'by', f.by, 'job', f.id, 'pool', f.pool, 'kind', f.kind)
  end
end
