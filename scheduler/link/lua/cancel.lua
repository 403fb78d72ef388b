-- The head cancels a job: a queued one leaves the queue; a running one's worker is told (and
-- its emits are fenced from now on, since the job is gone).
-- A cancel that finds no job leaves a tombstone for ten minutes, so that a submit still on its
-- way (its sender was cancelled while sending, and cancelled the job from another connection)
-- is refused when it arrives.
-- The job's stream and resume note go too: the head cancelling is done with them, and a
-- worker may have written the stream again after that head deleted it (the cancel reached
-- Redis late: sent again at a later tick), which then stayed for its whole TTL. From here the
-- job is gone and no one can write for it.
-- A job another head took over (its client resumed the stream there, adopt.lua) is not the
-- cancelling head's any more: left running, its stream kept (the first head, alive, saw its
-- client leave only now).
-- ARGV: prefix, id, head (optional).   Returns the worker that held it, or "".
local p, id = ARGV[1], ARGV[2]
local jk = p .. "job:" .. id
if ARGV[3] then
  local owner = redis.call("HGET", jk, "head")
  if owner and owner ~= ARGV[3] then
    return ""
  end
end
redis.call("DEL", p .. "s:" .. id, p .. "r:" .. id)
local cur = redis.call("HMGET", jk, "state", "worker", "qos", "member")
if cur[1] == false then
  redis.call("SET", p .. "x:" .. id, "1", "EX", 600)
  return ""
end
if cur[1] == "q" then
  redis.call("ZREM", p .. "q:" .. cur[3], cur[4])
  redis.call("ZREM", p .. "qa:" .. cur[3], cur[4])
end
redis.call("DEL", jk)
redis.call("ZREM", p .. "leases", id)
if cur[1] == "run" and cur[2] ~= "" then
  redis.call("PUBLISH", p .. "w:" .. cur[2], "cancel " .. id)
  return cur[2]
end
return ""
