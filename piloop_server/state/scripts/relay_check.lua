-- relay_check: may this job's relay call go through? Only while its lease is live under this token,
-- held by this worker, and not cancelled. Writes nothing but a refused foreign caller's event.
-- @call KEYS 3 ARGV 4
-- KEYS[1] lease  KEYS[2] job hash  KEYS[3] events
-- ARGV[1] job id  ARGV[2] token  ARGV[3] worker  ARGV[4] the calling token's identity (include/relay_guard.lua)
-- Reply: {kind, campaign, pool, spec}. Error PILOOP_LEASE_LOST when the call must be refused.
-- @include relay_guard
return {guard[3], guard[4] or '', guard[5], guard[6] or '{}'}
