-- Put a job in the global queue (or back in it after its worker was lost).
-- Returns the epoch; -1 fenced, -2 a duplicate id, -3 cancelled before it arrived.
-- ARGV: prefix, id, qos, priority, aging_divisor_s, data, head, requeue (0|1), expect_epoch (-1: new job),
--       resend (0|1: this head sends its own submit again, not knowing whether the first one ran),
--       request_of (the first job of its request, "" for one), waited_ms (its wait before this head
--       queued it): with the arrival, what queued.lua counts a request's wait and band depth from
-- Order inside a class is a static score: priority + waited_s / divisor ranks jobs exactly as
-- -(priority - arrival_s / divisor) does, whatever the time now, so a sorted set holds it.
-- A job put back after a loss goes ahead of every arrival of its class (as a preempted one); in a
-- class aging lifts it into it ranks by its score as an arrival (``natural``), as a preempted
-- job does in a worker's queues (scheduler.core.queues).
local p, id = ARGV[1], ARGV[2]
local qos, prio, divisor = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local data, head, requeue, expect = ARGV[6], ARGV[7], ARGV[8] == "1", tonumber(ARGV[9])
local resend = ARGV[10] == "1"
local request_of, waited_before = ARGV[11] or "", tonumber(ARGV[12]) or 0
local jk = p .. "job:" .. id
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local epoch = 0
if expect >= 0 then
  local cur = redis.call("HMGET", jk, "epoch", "state")
  if cur[1] == false or tonumber(cur[1]) ~= expect or cur[2] ~= "lost" then
    return -1  -- fenced: not lost, or lost again meanwhile
  end
  epoch = expect
elseif redis.call("EXISTS", jk) == 1 then
  local cur = redis.call("HMGET", jk, "head", "data", "epoch")
  if cur[1] == head and cur[2] == data then
    return tonumber(cur[3])  -- this head's own submit again (its first reply was lost): no-op
  end
  return -2  -- duplicate id
elseif resend and redis.call("EXISTS", p .. "s:" .. id) == 1 then
  -- the first submit did run, and its job has already ended (emit deleted it); its stream is
  -- kept: the head reads the reply there instead of running the job a second time
  return 0
elseif redis.call("EXISTS", p .. "x:" .. id) == 1 then
  return -3  -- cancelled before it arrived (cancel.lua's tombstone)
end
local arrival = now_ms
if requeue then
  arrival = tonumber(redis.call("HGET", jk, "arrival") or now_ms)
end
local seq = redis.call("INCR", p .. "seq")
-- its score as an arrival (what ranks it in a class aging lifts it into, pick.lua)
local natural = -prio
if divisor > 0 then
  natural = arrival / 1000.0 / divisor - prio
end
local score = natural
if requeue then
  score = -1e300
end
local member = string.format("%016d", seq) .. ":" .. id
redis.call("HSET", jk, "data", data, "qos", qos, "prio", prio, "arrival", arrival, "state", "q",
  "worker", "", "epoch", epoch, "head", head, "member", member, "requeued", requeue and 1 or 0,
  "enq", now_ms, "req", request_of, "pre", waited_before, "natural", string.format("%.17g", natural))
redis.call("EXPIRE", jk, 86400)
redis.call("ZADD", p .. "q:" .. qos, score, member)
redis.call("ZADD", p .. "qa:" .. qos, arrival, member)  -- arrival order: pick.lua finds the oldest
redis.call("PUBLISH", p .. "new", qos)
return epoch
