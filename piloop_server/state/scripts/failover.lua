-- failover: a new primary that may lack the last writes (a promoted replica): move to a generation above both
-- Redis's and the caller's record, so that no token is issued again, and hold every claim for grace while the
-- workers re-announce what they hold. Once per new primary: another server that saw the same promotion finds it done.
-- @call KEYS 2 ARGV 3
-- KEYS[1] generation  KEYS[2] daemon hash
-- ARGV[1] the new primary's replication id  ARGV[2] the generation the caller's record holds  ARGV[3] hold (ms)
-- Reply: {1 when marked now (0: already marked for this primary), the generation}
-- @include clock
local gen = tonumber(redis.call('GET', KEYS[1]) or '0')
if redis.call('HGET', KEYS[2], 'failover_replid') == ARGV[1] then return {0, gen} end
gen = math.max(gen, tonumber(ARGV[2])) + 1
local now = clock_ms()
redis.call('SET', KEYS[1], gen)
local hold = math.max(tonumber(redis.call('HGET', KEYS[2], 'hold_until') or '0'), now + tonumber(ARGV[3]))
redis.call('HSET', KEYS[2], 'hold_until', hold, 'failover_at', now, 'failover_replid', ARGV[1])
return {1, gen}
