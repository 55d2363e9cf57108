-- fence (included first by each script the pass runs): a pass writes only while its server leads. For such a
-- script the loader (state/scripts.py) appends the leader lease's key to KEYS and the caller's fencing token to
-- ARGV (before the events bound); a token that is not the lease's now refuses the whole call before it writes
-- anything (PILOOP_FENCED), so a deposed leader's late pass changes nothing. An empty token (a call from outside
-- the pass: a tool, a test) is not checked; the pass always sends its own.
local FENCE_TOKEN = ARGV[#ARGV - 1]
if FENCE_TOKEN ~= '' then
  local lead = redis.call('GET', KEYS[#KEYS])
  if not lead or string.match(lead, '^(%d+) ') ~= FENCE_TOKEN then
    return redis.error_reply('PILOOP_FENCED token ' .. FENCE_TOKEN .. ' no longer leads the pass (the lease: ' ..
      (lead or 'none') .. ')')
  end
end
