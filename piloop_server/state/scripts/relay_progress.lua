-- relay_progress: append a job's own progress note, while its lease is live under this token
-- (held by this worker, not cancelled); the list keeps the newest ARGV[5] notes.
-- @call KEYS 4 ARGV 6
-- KEYS[1] lease  KEYS[2] job hash  KEYS[3] events  KEYS[4] job progress (list)
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] note (JSON, without its time)  ARGV[5] keep
-- ARGV[6] the calling token's identity (include/relay_guard.lua)
-- Reply: the number of notes kept. Error PILOOP_LEASE_LOST when refused (nothing changed).
-- @include relay_guard
-- @include clock
local now = clock_ms()
local note = cjson.decode(ARGV[4])
note['at_ms'] = now
redis.call('RPUSH', KEYS[4], cjson.encode(note))
redis.call('LTRIM', KEYS[4], -tonumber(ARGV[5]), -1)
redis.call('HSET', KEYS[2], JF.updated, now)
return redis.call('LLEN', KEYS[4])
