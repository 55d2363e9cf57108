-- clock (included): Redis's own time in ms. Every decision is timed here, never by a client's clock.
local function clock_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
