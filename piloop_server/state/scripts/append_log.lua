-- append_log: the holder adds log chunk addresses to its job's log; past a cap they are counted, not kept.
-- @call KEYS 4 ARGV 8+2n
-- KEYS[1] lease  KEYS[2] job hash  KEYS[3] job log (list)  KEYS[4] events
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] the most chunks a job keeps  ARGV[5] the most bytes it
-- keeps ([plugins.state] log_max_bytes)  ARGV[6] the room past them for the worker's marker  ARGV[7] n
-- ARGV[8..7+n] chunks  ARGV[8+n..7+2n] their sizes as the CAS holds them (-1: the CAS lacks it)
-- ARGV[8+2n] the calling token's identity (lease_check's owner)
-- A log is cut once: the first chunk past either cap and every later one are dropped, so the kept log is always
-- a prefix of what the job wrote. `log_truncated` is set to the byte cap once the kept bytes pass it (the worker's
-- marker) or a chunk was dropped for its bytes.
-- Reply: the number of chunks of this call that were dropped. Errors: PILOOP_LEASE_LOST when this worker does not
-- hold the lease under this token, PILOOP_BAD_REQUEST when the CAS lacks a chunk (nothing changed either way).
-- @include lease_check
if lease_check(KEYS[1], KEYS[2], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[8 + 2 * tonumber(ARGV[7])], 0) ~= 'ok' then
  return redis.error_reply('PILOOP_LEASE_LOST job ' .. ARGV[1] .. ' is not leased to worker ' .. ARGV[3] ..
    ' under this token')
end
local n = tonumber(ARGV[7])
for i = 1, n do
  if tonumber(ARGV[7 + n + i]) < 0 then
    return redis.error_reply('PILOOP_BAD_REQUEST the CAS lacks log chunk ' .. ARGV[7 + i] ..
      ': put a chunk before naming it')
  end
end
local f = redis.call('HMGET', KEYS[2], JF.log_dropped, JF.log_bytes)
local room = tonumber(ARGV[4]) - redis.call('LLEN', KEYS[3])
local cap, marker = tonumber(ARGV[5]), tonumber(ARGV[6])
local bytes = tonumber(f[2] or '0') or 0
local kept, cut = 0, false
if (tonumber(f[1] or '0') or 0) == 0 then
  for i = 1, n do
    local size = tonumber(ARGV[7 + n + i])
    if kept >= room then break end
    if bytes + size > cap + marker then
      cut = true
      break
    end
    redis.call('RPUSH', KEYS[3], ARGV[7 + i])
    bytes = bytes + size
    kept = kept + 1
  end
end
if kept > 0 then redis.call('HSET', KEYS[2], JF.log_bytes, string.format('%d', bytes)) end
if cut or bytes > cap then redis.call('HSET', KEYS[2], JF.log_truncated, ARGV[5]) end
if kept < n then redis.call('HINCRBY', KEYS[2], JF.log_dropped, n - kept) end
return n - kept
