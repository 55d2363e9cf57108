-- leader: take, renew or give up the lease of the one server that runs the pass (state/leader.py).
-- @call KEYS 3 ARGV 3
-- KEYS[1] leader lease  KEYS[2] fencing counter  KEYS[3] events
-- ARGV[1] this server's instance id  ARGV[2] the token it holds ('' for none)  ARGV[3] the lease's TTL (ms; 0: give
-- it up)
-- The lease's value is '<token> <instance id>'. Its holder renews it (PEXPIRE) under its token; a free lease is
-- taken (SET NX PX) with a new token from the counter (INCR: tokens never go backwards) and one `pass.leader` event.
-- Reply: {token, holder}, token '' when another server holds the lease (or it was given up).
-- @include events
local held = redis.call('GET', KEYS[1])
local mine = ARGV[2] ~= '' and held == ARGV[2] .. ' ' .. ARGV[1]
if ARGV[3] == '0' then
  if mine then redis.call('DEL', KEYS[1]) end
  return {'', ''}
end
if mine then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {ARGV[2], ARGV[1]}
end
if held then return {'', string.match(held, '^%d+ (.*)$') or ''} end
local token = tostring(redis.call('INCR', KEYS[2]))
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'NX', 'PX', ARGV[3])
emit(KEYS[3], 'pass.leader', 'server:' .. ARGV[1], 'server', ARGV[1], 'token', token, 'was', ARGV[2])
return {token, ARGV[1]}
