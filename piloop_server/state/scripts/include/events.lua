-- events (included): emit(key, type, by, field, value, ...) appends one event to the stream at `key`.
-- The bound is the last ARGV of every call, appended by the loader (state/scripts.py EventCap): 'most value_bytes'.
-- The stream keeps about `most` entries (MAXLEN ~) and cuts any value past `value_bytes`, so its memory is bounded
-- whatever a caller sends. A `token` field keeps only a lease token's fencing order (before its `.`): the random
-- part that makes it unguessable is the holder's alone, never shown to a reader of the events.
local EVENTS_MOST, EVENT_VALUE_BYTES = string.match(ARGV[#ARGV], '^(%d+) (%d+)$')
EVENT_VALUE_BYTES = tonumber(EVENT_VALUE_BYTES)
local function emit(key, etype, by, ...)
  local fields = {'type', etype, 'by', by}
  local rest = {...}
  for i = 1, #rest do
    local v = tostring(rest[i])
    if i % 2 == 0 and rest[i - 1] == 'token' then v = string.match(v, '^[^.]*') end
    if i % 2 == 0 and #v > EVENT_VALUE_BYTES then v = string.sub(v, 1, EVENT_VALUE_BYTES) .. '...' end
    fields[#fields + 1] = v
  end
  redis.call('XADD', key, 'MAXLEN', '~', EVENTS_MOST, '*', unpack(fields))
end
