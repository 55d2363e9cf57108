-- relay_cancel: a job cancels a child it queued (nested work), through its relay, checked against its lease
-- (relay_guard) and the child's `parent` in the same step.
-- @call KEYS 7 ARGV 6
-- KEYS[1] lease  KEYS[2] job hash (the caller)  KEYS[3] events  KEYS[4] the child's hash  KEYS[5] its queue
-- KEYS[6] delayed  KEYS[7] ended
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] the child's id  ARGV[5] by
-- ARGV[6] the calling token's identity (include/relay_guard.lua)
-- Reply: the child's state after (cancelled, cancelling, or the end it had reached). Errors: PILOOP_LEASE_LOST,
-- PILOOP_FORBIDDEN when the child is not the caller's.
-- @include relay_guard
-- @include clock
-- @include cancel_job
if redis.call('HGET', KEYS[4], JF.parent) ~= ARGV[1] then
  return redis.error_reply('PILOOP_FORBIDDEN job ' .. ARGV[4] .. ' is not a job ' .. ARGV[1] .. ' queued')
end
return tostring(cancel_job(KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[3], ARGV[4], ARGV[5],
  'cancelled by its parent ' .. ARGV[1], clock_ms()))
