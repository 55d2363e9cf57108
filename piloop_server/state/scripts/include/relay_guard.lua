-- relay_guard (included): refuse a relayed call unless the job's lease is live under this token, held by
-- this worker, and not cancelled. Needs KEYS[1] lease, KEYS[2] job hash, ARGV[1] job id, ARGV[2] token,
-- ARGV[3] worker; leaves `guard` = {worker, cancel, kind, campaign, pool, spec} of the job.
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ': its lease under this token has ended')
end
local guard = redis.call('HMGET', KEYS[2], 'worker', 'cancel', 'kind', 'campaign', 'pool', 'spec')
if guard[1] ~= ARGV[3] then
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ' is not leased to worker ' .. ARGV[3])
end
if guard[2] == '1' then
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ' was cancelled: its lease is ending')
end
