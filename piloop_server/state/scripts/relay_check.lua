-- relay_check: may this job's relay call go through? Only while its lease is live under this token,
-- held by this worker, and not cancelled. Changes nothing.
-- KEYS[1] lease  KEYS[2] job hash
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker
-- Reply: {kind, campaign, pool, spec}. Error PILOOP_LEASE_LOST when the call must be refused.
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ': its lease under this token has ended')
end
local f = redis.call('HMGET', KEYS[2], 'worker', 'cancel', 'kind', 'campaign', 'pool', 'spec')
if f[1] ~= ARGV[3] then
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ' is not leased to worker ' .. ARGV[3])
end
if f[2] == '1' then
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ' was cancelled: its lease is ending')
end
return {f[3], f[4] or '', f[5], f[6] or '{}'}
