-- relay_guard (included): refuse a relayed call unless the job's lease is live under this token, held by
-- this worker, and not cancelled. Self-contained (the relay scripts' own check, read in the script that acts).
-- Needs KEYS[1] lease, KEYS[2] job hash, KEYS[3] events; ARGV[1] job id, ARGV[2] token, ARGV[3] worker, and as its
-- last ARGV before the events bound the loader appends, the identity of the token that calls ('' : not checked).
-- Leaves `guard` = {worker, cancel, kind, campaign, pool, spec, history, owner}.
-- A caller that gives the holder's name from another token than the one that name was bound to when it claimed
-- (the job's `owner`) is refused as foreign (as include/lease_check.lua does).
-- A caller that is not the job's holder and never held it under this token (not in its `history`) leaves one
-- `lease.foreign_token` event naming both workers; nothing else is written on a refusal.
-- @include job_fields
-- @include events
local guard = redis.call('HMGET', KEYS[2], JF.worker, JF.cancel, JF.kind, JF.campaign, JF.pool, JF.spec, JF.history,
  JF.owner)
local held = redis.call('GET', KEYS[1])
local caller_owner = ARGV[#ARGV - 1]
if guard[1] == ARGV[3] and caller_owner ~= '' and (guard[8] or '') ~= '' and guard[8] ~= caller_owner then
  emit(KEYS[3], 'lease.foreign_token', 'worker:' .. ARGV[3], 'job', ARGV[1], 'worker', ARGV[3],
    'holder', guard[1] or '', 'call', 'relay', 'owner', caller_owner)
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ' is not leased to worker ' .. ARGV[3])
end
if guard[1] ~= ARGV[3] or held ~= ARGV[2] then
  local was = guard[7] and string.find(' ' .. guard[7] .. ' ', ' ' .. ARGV[3] .. '/' .. ARGV[2] .. ' ', 1, true)
  if (guard[1] or '') ~= '' and guard[1] ~= ARGV[3] and not was then
    emit(KEYS[3], 'lease.foreign_token', 'worker:' .. ARGV[3], 'job', ARGV[1], 'worker', ARGV[3],
      'holder', guard[1] or '', 'call', 'relay')
  end
  if held ~= ARGV[2] then
    return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ': its lease under this token has ended')
  end
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ' is not leased to worker ' .. ARGV[3])
end
if guard[2] == '1' then
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ' was cancelled: its lease is ending')
end
