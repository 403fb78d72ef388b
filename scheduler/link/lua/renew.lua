-- A worker renews the leases of the jobs it holds and says how many lanes it has free.
-- ARGV: prefix, worker, lease_ms, free_lanes, id...   Returns the ids it no longer holds.
local p, worker, lease_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("HSET", p .. "free", worker, ARGV[4] .. "|" .. now_ms)
local gone = {}
for i = 5, #ARGV do
  local id = ARGV[i]
  local cur = redis.call("HMGET", p .. "job:" .. id, "worker", "state")
  if cur[1] == worker and cur[2] == "run" then
    redis.call("ZADD", p .. "leases", now_ms + lease_ms, id)
  else
    table.insert(gone, id)
  end
end
return gone
