-- dependencies: the pass settles the children of the jobs that ended since its last look.
-- @call KEYS 4 ARGV 3
-- KEYS[1] ended  KEYS[2] the cursor (the `ended` score the next look starts at)  KEYS[3] events  KEYS[4] delayed
-- ARGV[1] key prefix  ARGV[2] batch size  ARGV[3] overlap (ms): the next look starts this far before the last
-- score seen, since a job may end in the very ms of this look (or Redis's clock may step back a little); after a
-- full batch it starts at the batch's last score. The cursor is written only when it moves: an idle pass writes
-- nothing.
-- For each parent ended since then that has a `children` set: each child still `waiting` is settled (queued, or
-- ended naming the parent: include/dependencies.lua); a parent that ended `cancelled` cancels the children it queued
-- from inside itself (nested: their `parent` is it) that have not ended. Then the set is deleted: a child still
-- waiting is in the set of each parent it still waits on. Idempotent (a second daemon finds nothing waiting, no
-- set), and a grandchild is settled by the next pass, when its ended parent is seen.
-- Reply: {jobs queued, jobs ended or cancelling}.
-- Fenced: the leader lease and the pass's token follow (include/fence.lua).
-- @include fence
-- @include clock
-- @include dependencies
-- @include cancel_job
local BY = 'service:daemon'
local now = clock_ms()
local prefix, batch, overlap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local cursor = tonumber(redis.call('GET', KEYS[2]) or '0')
local got = redis.call('ZRANGEBYSCORE', KEYS[1], cursor, '+inf', 'WITHSCORES', 'LIMIT', 0, batch)
local queued, ended = 0, 0
local last = nil
for i = 1, #got, 2 do
  local parent, score = got[i], tonumber(got[i + 1])
  if not last or score > last then last = score end
  local set = prefix .. 'job:' .. parent .. ':children'
  local kids = redis.call('SMEMBERS', set)
  if #kids > 0 then
    local pstate = redis.call('HGET', prefix .. 'job:' .. parent, JF.state)
    for _, kid in ipairs(kids) do
      local job = prefix .. 'job:' .. kid
      local f = redis.call('HMGET', job, JF.state, JF.parent, JF.pool, JF.kind)
      if f[1] == 'waiting' then
        local st = settle(prefix, KEYS[3], KEYS[1], kid, BY, now)
        if st == 'queued' then queued = queued + 1 elseif st == 'cancelled' then ended = ended + 1 end
      end
      f = redis.call('HMGET', job, JF.state, JF.parent, JF.pool, JF.kind)
      if pstate == 'cancelled' and f[2] == parent and (f[1] == 'queued' or f[1] == 'waiting' or f[1] == 'leased'
          or f[1] == 'running') then
        cancel_job(job, prefix .. 'queue:' .. f[3] .. ':' .. f[4], KEYS[4], KEYS[1], KEYS[3], kid, BY,
          'cancelled with its parent ' .. parent, now)
        ended = ended + 1
      end
    end
    redis.call('DEL', set)
  end
end
if last then
  local start = last
  if #got < 2 * batch then start = last - overlap end
  if start > cursor then redis.call('SET', KEYS[2], tostring(start)) end
end
return {queued, ended}
