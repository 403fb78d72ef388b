-- A head takes over a job whose client resumed its stream there (Last-Event-ID): the job's
-- worker keeps running it while this head is alive, whatever became of the first one.
-- ARGV: prefix, id, head.   Returns 1, or 0 when there is no such job (finished, cancelled).
local jk = ARGV[1] .. "job:" .. ARGV[2]
if redis.call("EXISTS", jk) == 0 then
  return 0
end
redis.call("HSET", jk, "head", ARGV[3])
return 1
