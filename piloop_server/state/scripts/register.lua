-- register: a worker announces itself (at start, and again when Redis forgot it).
-- @call KEYS 5 ARGV 12
-- KEYS[1] worker hash  KEYS[2] worker alive  KEYS[3] workers set  KEYS[4] events
-- KEYS[5] the names the calling token holds (a set)
-- ARGV[1] name  ARGV[2] pool  ARGV[3] image  ARGV[4] cas id  ARGV[5] sample (JSON)
-- ARGV[6] grace (ms)  ARGV[7] protocol  ARGV[8] by  ARGV[9] info (JSON: host, pid, version)
-- ARGV[10] the calling token's identity (`token:<name>`, `socket`, `proxy`): the name's owner
-- ARGV[11] the most names one token holds at once (0: no cap)  ARGV[12] the prefix of a worker hash's key
-- A name belongs to the token that registered it while its hash lives (until the pass or `piloop worker forget`
-- forgets it): another token's register under it is refused, and so are its heartbeats and lease calls
-- (heartbeat.lua, include/lease_check.lua). A name of the token's set whose hash is gone is dropped from the set
-- when the cap is reached.
-- Reply: 'ok'. Errors: PILOOP_REFUSED when another token holds the name; PILOOP_TOO_LARGE past the names' cap.
-- @include clock
-- @include events
local bound = redis.call('HGET', KEYS[1], 'owner') or ''
if bound ~= '' and bound ~= ARGV[10] then
  return redis.error_reply('PILOOP_REFUSED worker name ' .. ARGV[1] .. ' is held by another token while its ' ..
    'record lives: choose another name')
end
local cap = tonumber(ARGV[11])
if cap > 0 and redis.call('SISMEMBER', KEYS[5], ARGV[1]) == 0 then
  if redis.call('SCARD', KEYS[5]) >= cap then
    for _, n in ipairs(redis.call('SMEMBERS', KEYS[5])) do
      if (redis.call('HGET', ARGV[12] .. n, 'owner') or '') ~= ARGV[10] then redis.call('SREM', KEYS[5], n) end
    end
  end
  if redis.call('SCARD', KEYS[5]) >= cap then
    return redis.error_reply('PILOOP_TOO_LARGE this token holds ' .. cap .. ' worker names, the cap ' ..
      '([plugins.state] worker_names_max): a silent one is forgotten after a few tolerations, or use another token')
  end
end
local now = clock_ms()
redis.call('HSET', KEYS[1], 'name', ARGV[1], 'pool', ARGV[2], 'image', ARGV[3], 'cas', ARGV[4],
  'sample', ARGV[5], 'protocol', ARGV[7], 'info', ARGV[9], 'registered', now, 'seen', now,
  'reason', '', 'owner', ARGV[10])
if redis.call('HEXISTS', KEYS[1], 'draining') == 0 then
  redis.call('HSET', KEYS[1], 'draining', '0')
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[6])
redis.call('SADD', KEYS[3], ARGV[1])
if cap > 0 then redis.call('SADD', KEYS[5], ARGV[1]) end
emit(KEYS[4], 'worker.registered', ARGV[8], 'worker', ARGV[1], 'pool', ARGV[2], 'image', ARGV[3])
return 'ok'
