-- A worker emits events for one job: only the lease holder of the current epoch may (fencing).
-- ARGV: prefix, id, epoch, worker, terminal (0|1), maxlen, ttl_s, payload...
-- Returns 1, or 0 when the job is no longer this worker's (lost, cancelled, finished).
local p, id, epoch, worker = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local jk = p .. "job:" .. id
local cur = redis.call("HMGET", jk, "epoch", "worker", "state")
if cur[1] == false or tonumber(cur[1]) ~= epoch or cur[2] ~= worker or cur[3] ~= "run" then
  return 0
end
local sk = p .. "s:" .. id
for i = 8, #ARGV do
  redis.call("XADD", sk, "MAXLEN", "~", ARGV[6], "*", "m", ARGV[i])
end
redis.call("EXPIRE", sk, tonumber(ARGV[7]))
if ARGV[5] == "1" then
  redis.call("DEL", jk)
  redis.call("ZREM", p .. "leases", id)
end
return 1
