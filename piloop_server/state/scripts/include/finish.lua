-- finish (included): the one way a job ends. It writes the end state, its reason and when, and indexes the job by
-- when it ended (`ended`, a sorted set) for retention (prune.lua), so no ended job escapes the prune.
-- finish(job_key, ended_key, id, state, reason, now, ...) where ... are more field/value pairs to write.
-- @include job_fields
local function finish(job_key, ended_key, id, state, reason, now, ...)
  redis.call('HSET', job_key, JF.state, state, JF.reason, reason, JF.ended, now, JF.updated, now, ...)
  redis.call('ZADD', ended_key, now, id)
end
