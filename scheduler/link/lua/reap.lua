-- Any process: jobs whose lease ran out (their worker died) are marked lost, their epoch moves
-- on (the old worker can emit no more) and a "lost" marker ends their stream's current run; the
-- head that owns the job puts it back in the queue, continuing after the text delivered.
-- ARGV: prefix, maxlen, ttl_s.   Returns the number reaped.
local p = ARGV[1]
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call("ZRANGEBYSCORE", p .. "leases", "-inf", now_ms, "LIMIT", 0, 100)
for _, id in ipairs(expired) do
  redis.call("ZREM", p .. "leases", id)
  local jk = p .. "job:" .. id
  if redis.call("HGET", jk, "state") == "run" then
    local epoch = redis.call("HINCRBY", jk, "epoch", 1)
    redis.call("HSET", jk, "state", "lost", "worker", "")
    local sk = p .. "s:" .. id
    redis.call("XADD", sk, "MAXLEN", "~", ARGV[2], "*", "m", '{"type":"lost","epoch":' .. epoch .. '}')
    redis.call("EXPIRE", sk, tonumber(ARGV[3]))
    redis.call("EXPIRE", p .. "r:" .. id, tonumber(ARGV[3]))  -- its resume note lives as long
  end
end
-- workers that stopped renewing no longer count as having free lanes
local free = redis.call("HGETALL", p .. "free")
for i = 1, #free, 2 do
  local ts = string.match(free[i + 1], "|(%d+)$")
  if ts == nil or now_ms - tonumber(ts) > 10000 then redis.call("HDEL", p .. "free", free[i]) end
end
return #expired
