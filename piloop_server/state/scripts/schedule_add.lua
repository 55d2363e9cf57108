-- schedule_add: a new periodic schedule, its record and its first tick in one step.
-- @call KEYS 3 ARGV 4
-- KEYS[1] schedules (hash name -> record JSON)  KEYS[2] ticks (sorted set name -> next tick, ms)  KEYS[3] events
-- ARGV[1] name  ARGV[2] record (JSON)  ARGV[3] first tick (ms)  ARGV[4] by
-- Reply: 1. Error PILOOP_CONFLICT when a schedule has that name (nothing changes).
-- @include events
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return redis.error_reply('PILOOP_CONFLICT schedule ' .. ARGV[1] .. ' exists: `piloop schedule remove ' ..
    ARGV[1] .. '` first')
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
emit(KEYS[3], 'schedule.added', ARGV[4], 'schedule', ARGV[1], 'next_ms', ARGV[3])
return 1
