-- relay_submit: a campaign's agent queues its campaign's evaluation of a commit through its worker's relay, in
-- one step with the check that its lease is live under this token (held by this worker, not cancelled), that
-- it is an agent of this campaign, and that it has queued fewer than its cap. The spec, pool and campaign come
-- from the campaign record (built in Python), never from the agent. The new job's fields are those enqueue.lua
-- writes, plus `parent`; the caller's `relayed` counts the evaluations it queued.
-- @call KEYS 8 ARGV 10
-- KEYS[1] lease  KEYS[2] job hash (the caller)  KEYS[3] events  KEYS[4] new job hash  KEYS[5] queue (pool,
-- evaluation)  KEYS[6] jobs index  KEYS[7] delayed  KEYS[8] expiring
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] new job id  ARGV[5] pool  ARGV[6] campaign
-- ARGV[7] spec (JSON)  ARGV[8] by  ARGV[9] the most evaluations one agent may queue
-- ARGV[10] the calling token's identity (include/relay_guard.lua)
-- Reply: {new job id, 1 if queued now or 0 if this agent had queued it already}. Errors: PILOOP_LEASE_LOST
-- when the lease does not allow it, PILOOP_FORBIDDEN when the job may not submit this, PILOOP_CONFLICT when
-- the id is another's (nothing changed on any error).
-- @include relay_guard
-- @include new_job
-- @include clock
if guard[3] ~= 'agent' then
  return redis.error_reply('PILOOP_FORBIDDEN job ' .. ARGV[1] .. ' is an evaluation: only a campaign\'s agent ' ..
    'may submit (an evaluation that queues evaluations could loop forever)')
end
if (guard[4] or '') ~= ARGV[6] then
  return redis.error_reply('PILOOP_FORBIDDEN job ' .. ARGV[1] .. ' is not an agent of campaign ' .. ARGV[6])
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  if redis.call('HGET', KEYS[4], JF.parent) == ARGV[1] then
    return {ARGV[4], 0}
  end
  return redis.error_reply('PILOOP_CONFLICT job ' .. ARGV[4] .. ' exists')
end
local n = tonumber(redis.call('HGET', KEYS[2], JF.relayed) or '0')
if n >= tonumber(ARGV[9]) then
  return redis.error_reply('PILOOP_FORBIDDEN job ' .. ARGV[1] .. ' has queued ' .. n .. ' evaluations, the most ' ..
    'one agent may queue (' .. ARGV[9] .. ')')
end
local now = clock_ms()
new_job(KEYS[4], KEYS[5], KEYS[6], KEYS[3], now, {id = ARGV[4], kind = 'evaluation', pool = ARGV[5],
  campaign = ARGV[6], image = '', spec = ARGV[7], by = ARGV[8], parent = ARGV[1], delayed = KEYS[7],
  expiring = KEYS[8]})
redis.call('HINCRBY', KEYS[2], JF.relayed, 1)
return {ARGV[4], 1}
