-- schedule_tick: the pass queues each due schedule's job, once a tick, however many daemons run it.
-- @call KEYS 6 ARGV 1+4n
-- KEYS[1] schedules  KEYS[2] ticks  KEYS[3] jobs index  KEYS[4] events  KEYS[5] delayed  KEYS[6] expiring
-- ARGV[1] key prefix  then for each due schedule four: its name, the tick the caller read as due (ms), the tick
-- after it (ms, computed by the caller from the cron), and the job id for that tick (name and tick: the same id
-- whoever computes it)
-- A schedule is acted on only while its tick is still the one read and is not in the future (Redis's clock): a
-- second daemon that read the same tick finds it moved on and does nothing, so each tick queues one job. The job is
-- the record's (kind, pool, campaign, image, spec), written by new_job; the tick advances in the same step.
-- Reply: the ids of the jobs queued.
-- Fenced: the leader lease and the pass's token follow (include/fence.lua).
-- @include fence
-- @include clock
-- @include new_job
local now = clock_ms()
local prefix = ARGV[1]
local out = {}
for i = 2, #ARGV - 2, 4 do  -- the pass's token and the events bound last
  local name, due, after, id = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local at = redis.call('ZSCORE', KEYS[2], name)
  local raw = redis.call('HGET', KEYS[1], name)
  if at and raw and tonumber(at) == tonumber(due) and tonumber(at) <= now then
    redis.call('ZADD', KEYS[2], after, name)
    local rec = cjson.decode(raw)
    if redis.call('EXISTS', prefix .. 'job:' .. id) == 0 then
      new_job(prefix .. 'job:' .. id, prefix .. 'queue:' .. rec.pool .. ':' .. rec.kind, KEYS[3], KEYS[4], now,
        {id = id, kind = rec.kind, pool = rec.pool, campaign = rec.campaign or '', image = rec.image or '',
         spec = rec.spec, by = 'schedule:' .. name, delayed = KEYS[5], expiring = KEYS[6]})
      out[#out + 1] = id
    end
  end
end
return out
