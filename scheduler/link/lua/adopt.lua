-- A head takes over a job whose client resumed its stream there (Last-Event-ID): the job's
-- worker keeps running it while this head is alive, whatever became of the first one.
-- A "taken" marker on the job's stream tells every head reading it (the first, a live one
-- whose client left unseen; one that took it over before) that the job and its response are
-- this head's now: they stop reading it, cancel nothing and write no activity row for it.
-- ARGV: prefix, id, head.   Returns 1, or 0 when there is no such job (finished, cancelled).
local jk = ARGV[1] .. "job:" .. ARGV[2]
local sk = ARGV[1] .. "s:" .. ARGV[2]
if redis.call("EXISTS", sk) == 1 then
  redis.call("XADD", sk, "*", "m", cjson.encode({type = "taken", head = ARGV[3]}))
end
if redis.call("EXISTS", jk) == 0 then
  return 0
end
redis.call("HSET", jk, "head", ARGV[3])
return 1
