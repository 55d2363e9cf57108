-- append_log: the holder adds log chunk addresses to its job's log; past the cap they are counted, not kept.
-- KEYS[1] lease  KEYS[2] job hash  KEYS[3] job log (list)  KEYS[4] events
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] the most chunks a job keeps  ARGV[5] n  ARGV[6..5+n] chunks
-- Reply: the number of chunks of this call that were dropped (over the cap). Error PILOOP_LEASE_LOST when this
-- worker does not hold the lease under this token (nothing changed).
-- @include lease_check
if lease_check(KEYS[1], KEYS[2], KEYS[4], ARGV[1], ARGV[2], ARGV[3], 0) ~= 'ok' then
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ' is not leased to worker ' .. ARGV[3] ..
    ' under this token')
end
local room = tonumber(ARGV[4]) - redis.call('LLEN', KEYS[3])
local n = tonumber(ARGV[5])
local kept = math.max(0, math.min(room, n))
for i = 1, kept do redis.call('RPUSH', KEYS[3], ARGV[5 + i]) end
if kept < n then redis.call('HINCRBY', KEYS[2], JF.log_dropped, n - kept) end
return n - kept
