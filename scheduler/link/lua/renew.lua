-- A worker renews the leases of the jobs it holds and says how many lanes it has free.
-- ARGV: prefix, worker, lease_ms, free_lanes, id...
-- Returns {the ids it no longer holds, the ids whose head is gone}. A job whose head's key
-- (hb:HEAD) has lapsed is read by nobody: its lease ends now instead of being renewed, so the
-- next reap marks it lost (its stream says so), and a head that a client resumes it on puts it
-- back in the queue.
local p, worker, lease_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("HSET", p .. "free", worker, ARGV[4] .. "|" .. now_ms)
local gone, headless = {}, {}
for i = 5, #ARGV do
  local id = ARGV[i]
  local cur = redis.call("HMGET", p .. "job:" .. id, "worker", "state", "head")
  if cur[1] ~= worker or cur[2] ~= "run" then
    table.insert(gone, id)
  elseif cur[3] and cur[3] ~= "" and redis.call("EXISTS", p .. "hb:" .. cur[3]) == 0 then
    redis.call("ZADD", p .. "leases", 0, id)
    table.insert(headless, id)
  else
    redis.call("ZADD", p .. "leases", now_ms + lease_ms, id)
  end
end
return {gone, headless}
