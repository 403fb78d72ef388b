-- A worker emits events for one job: only the lease holder of the current epoch may (fencing).
-- ARGV: prefix, id, epoch, worker, terminal (0|1), maxlen, ttl_s, first, payload...
-- ``first`` numbers the first payload among every message this worker has emitted for the job
-- in this epoch. The job's hash counts the ones already appended ("n" .. epoch), so a batch
-- sent again (its reply was lost: a timeout, a dead connection, redis-py's own retry of the
-- pipeline) appends only what is new: nothing is appended twice.
-- The stream, and its resume note ``r:ID`` (if a head made one), expire ttl_s after this write.
-- Returns 1, or 0 when the job is no longer this worker's (lost, cancelled, finished).
local p, id, epoch, worker = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local jk = p .. "job:" .. id
local cur = redis.call("HMGET", jk, "epoch", "worker", "state")
if cur[1] == false or tonumber(cur[1]) ~= epoch or cur[2] ~= worker or cur[3] ~= "run" then
  return 0
end
local sk = p .. "s:" .. id
local first = tonumber(ARGV[8])
local have = tonumber(redis.call("HGET", jk, "n" .. epoch) or "0")
for i = 9, #ARGV do
  if first + (i - 9) >= have then
    redis.call("XADD", sk, "MAXLEN", "~", ARGV[6], "*", "m", ARGV[i])
  end
end
redis.call("EXPIRE", sk, tonumber(ARGV[7]))
redis.call("EXPIRE", p .. "r:" .. id, tonumber(ARGV[7]))  -- none: a no-op
if ARGV[5] == "1" then
  redis.call("DEL", jk)
  redis.call("ZREM", p .. "leases", id)
else
  redis.call("HSET", jk, "n" .. epoch, math.max(have, first + #ARGV - 8))
end
return 1
