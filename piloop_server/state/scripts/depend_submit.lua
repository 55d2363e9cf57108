-- depend_submit: a new job that waits on its parents (its spec's `after`): written `waiting`, in each parent's
-- `children` set, and settled at once (include/dependencies.lua), so one whose parents have all ended already is
-- queued or ended here, never left for a pass.
-- @call KEYS 5 ARGV 8
-- KEYS[1] job hash  KEYS[2] queue (pool, kind)  KEYS[3] jobs index  KEYS[4] events  KEYS[5] ended
-- ARGV[1] job id  ARGV[2] kind  ARGV[3] pool  ARGV[4] campaign  ARGV[5] image  ARGV[6] spec (JSON)  ARGV[7] by
-- ARGV[8] key prefix
-- Reply: the job's state (waiting, queued or cancelled). Errors: PILOOP_CONFLICT when the id exists,
-- PILOOP_BAD_REQUEST naming a parent that is not a job (nothing is written then).
-- @include clock
-- @include new_job
-- @include dependencies
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('PILOOP_CONFLICT job ' .. ARGV[1] .. ' exists')
end
local prefix = ARGV[8]
local spec = cjson.decode(ARGV[6])
for _, p in ipairs(spec.after or {}) do
  if p == ARGV[1] then return redis.error_reply('PILOOP_BAD_REQUEST job ' .. p .. ' cannot wait on itself') end
  if redis.call('EXISTS', prefix .. 'job:' .. p) == 0 then
    return redis.error_reply('PILOOP_BAD_REQUEST --after ' .. p .. ': no such job (never was, or removed)')
  end
end
local now = clock_ms()
new_job(KEYS[1], KEYS[2], KEYS[3], KEYS[4], now, {id = ARGV[1], kind = ARGV[2], pool = ARGV[3],
  campaign = ARGV[4], image = ARGV[5], spec = ARGV[6], by = ARGV[7], waiting = true})
wait_on(prefix, ARGV[1], spec)
return settle(prefix, KEYS[4], KEYS[5], ARGV[1], ARGV[7], now)
