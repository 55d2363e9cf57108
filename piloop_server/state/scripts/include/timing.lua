-- timing (included): a new job's place in line, countdown and expiry, from its spec (JobSpec's "timing and
-- priority" fields), read once when it is queued.
-- job_timing(spec JSON, now) -> {score, not_before (ms or nil), expires (ms or nil)}
--   score       now - priority * PRIORITY_STEP (2^42 ms): claims ZRANGE the queue from its lowest score, so a
--               higher priority (0..9, 9 first) goes ahead of every lower one and FIFO holds within one; the score
--               is kept on the job (JF.score), so a job queued again (a retry, a lost worker) keeps its place
--   not_before  with a countdown: the job waits in `delayed` until then (due.lua queues it)
--   expires     with an expiry: a job not leased by then ends `expired` (include/expiry.lua)
-- @include job_fields
local function job_timing(spec_json, now)
  local ok, spec = pcall(cjson.decode, spec_json or '{}')
  if not ok or type(spec) ~= 'table' then spec = {} end
  local priority = tonumber(spec.priority) or 0
  local countdown = tonumber(spec.countdown_seconds) or 0
  local expires = tonumber(spec.expires_seconds)
  local t = {score = now - math.floor(priority) * PRIORITY_STEP}
  if countdown > 0 then t.not_before = now + math.ceil(countdown * 1000) end
  if expires then t.expires = now + math.floor(expires * 1000) end
  return t
end
