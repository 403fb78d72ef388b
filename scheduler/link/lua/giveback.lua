-- A draining worker gives back jobs it picked but will not run (it began to drain between its
-- pick and their start): each goes back to its place in its class's queue, as it was before the
-- pick, for another worker. Its epoch stays moved on, so the worker can emit nothing more for it.
-- ARGV: prefix, worker, id...   Returns the number given back.
local p, worker = ARGV[1], ARGV[2]
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local jk = p .. "job:" .. id
  local cur = redis.call("HMGET", jk, "state", "worker", "qos", "member", "score", "arrival")
  if cur[1] == "run" and cur[2] == worker and cur[5] then
    redis.call("ZREM", p .. "leases", id)
    redis.call("HSET", jk, "state", "q", "worker", "")
    redis.call("ZADD", p .. "q:" .. cur[3], tonumber(cur[5]), cur[4])
    redis.call("ZADD", p .. "qa:" .. cur[3], tonumber(cur[6]), cur[4])
    redis.call("PUBLISH", p .. "new", cur[3])
    n = n + 1
  end
end
return n
