-- append_log: add log chunk addresses to a job's log while its lease holds under this token.
-- KEYS[1] lease  KEYS[2] job log (list)
-- ARGV[1] token  ARGV[2..] chunk addresses
-- Reply: 1 when appended, 0 when the token no longer holds the lease (nothing changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
for i = 2, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
return 1
