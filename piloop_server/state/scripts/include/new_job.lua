-- new_job (included): write a queued job's hash, queue it, index it and log `job.queued`.
-- new_job(job key, queue key, jobs index key, events key, now (ms), fields) where fields has id, kind, pool,
-- campaign, image, spec (JSON), by, delayed and expiring (their keys), and optionally parent (the job that queued
-- it) and waiting (true: the job waits on its `after` parents, `waiting` and in no queue, until the pass's
-- dependencies.lua settles it). Its spec's priority, countdown and expiry (include/timing.lua) set its queue score,
-- and put it in `delayed` (with `not_before`) instead of its queue, and in `expiring` (with `expires`); a waiting
-- job's countdown and expiry do not apply (it is queued at its score once its parents succeed: docs/jobs.md).
-- @include job_fields
-- @include events
-- @include timing
local function new_job(job_key, queue_key, jobs_key, events_key, now, f)
  local t = job_timing(f.spec, now)
  local score = string.format('%d', t.score)
  redis.call('HSET', job_key,
    JF.id, f.id, JF.kind, f.kind, JF.pool, f.pool, JF.campaign, f.campaign, JF.image, f.image,
    JF.spec, f.spec, JF.state, f.waiting and 'waiting' or 'queued', JF.attempts, 0, JF.lost, 0, JF.score, score,
    JF.created, now, JF.updated, now, JF.by, f.by, JF.worker, '', JF.token, '')
  if f.parent then redis.call('HSET', job_key, JF.parent, f.parent) end
  if not f.waiting then
    if t.expires then
      redis.call('HSET', job_key, JF.expires, t.expires)
      redis.call('ZADD', f.expiring, t.expires, f.id)
    end
    if t.not_before then
      redis.call('HSET', job_key, JF.not_before, t.not_before)
      redis.call('ZADD', f.delayed, t.not_before, f.id)
    else
      redis.call('ZADD', queue_key, score, f.id)
    end
  end
  redis.call('ZADD', jobs_key, now, f.id)
  if f.parent then
    emit(events_key, 'job.queued', f.by, 'job', f.id, 'pool', f.pool, 'kind', f.kind, 'parent', f.parent)
  else
    emit(events_key, 'job.queued', f.by, 'job', f.id, 'pool', f.pool, 'kind', f.kind)
  end
end
