-- A worker with free lanes takes the next jobs, by one worker's rules, in one atomic step.
-- ARGV: prefix, worker, n (lanes to fill), starvation_s (0 = off), lease_ms, floor (4 = none),
--       cap0..cap3, use0..use3, token
-- ``token`` names this call: a worker whose call failed (a timeout, a dead connection) sends
-- the same token again, and a pick that did run (its reply was lost) answers the jobs it took,
-- those still leased to this worker at that epoch, leased afresh, instead of taking more. They
-- were otherwise leased to a worker that did not know it: lost when their lease lapsed, as if
-- the worker had died (two such in a row failed a job with engine_crashed).
-- Class order under per-class lane caps (a class at its cap on this worker is skipped); a job
-- that has waited starvation_s rises one class per period waited (never above interactive);
-- inside a class the sorted set's order (requeued first, then score, then arrival); a job aging
-- lifted into a better class counts its priority there from that class's anchor as it counted
-- from its own (ANCHOR: scheduler.core.qos.CLASS_ANCHOR), since a request that sends no priority
-- has its class's anchor and a lifted one otherwise lost every tie to the jobs born in it. The
-- candidates of each class: the jobs put back after a loss (the first PUT_BACK), and of the
-- arrivals the first by score and the oldest (qa:C, by arrival), which has risen the most, so an
-- old job behind a newer one of higher priority still rises. A job put back heads its class's
-- sorted set but ranks by its score as an arrival once lifted: it must not stand in for the
-- arrivals' first or oldest (a lifted arrival of higher priority behind it went unseen). With a
-- floor (a worker with every lane busy asking to preempt its lowest running class), only
-- interactive or completion jobs of a class above the floor are taken, by their own class (aging
-- ignored), and only when no live worker has a free lane (that worker takes it without
-- preempting anyone).
-- Returns {id, epoch, data, waited_ms, ...}: waited_ms is how long a job that has not run yet
-- waited in the queue since its head put it there (Redis's clock at both ends; a job a draining
-- worker gave back unrun counts from its first arrival); -1 for a job put back after its worker
-- was lost (its first worker counted its wait, and the job itself, there).
local p, worker = ARGV[1], ARGV[2]
local n, starv, lease_ms, floor = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local caps, use = {}, {}
local ANCHOR = {[0] = 100, [1] = 0, [2] = 0, [3] = -100}
local REQUEUED = -1e300  -- the score of a job put back after a loss (enqueue.lua)
local PUT_BACK = 8  -- how many of those a class weighs at most
for c = 0, 3 do
  caps[c] = tonumber(ARGV[7 + c])
  use[c] = tonumber(ARGV[11 + c])
end
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token, pk = ARGV[15], p .. "pk:" .. worker
local saved = token and redis.call("GET", pk)
if saved then
  local prev = cjson.decode(saved)
  if prev[1] == token then  -- this same call again: what it took, if still ours
    local again = {}
    for i = 2, #prev, 3 do
      local id, epoch, waited = prev[i], prev[i + 1], prev[i + 2]
      local jk = p .. "job:" .. id
      local cur = redis.call("HMGET", jk, "state", "worker", "epoch", "data")
      if cur[1] == "run" and cur[2] == worker and tonumber(cur[3]) == epoch then
        redis.call("ZADD", p .. "leases", now_ms + lease_ms, id)
        table.insert(again, id)
        table.insert(again, epoch)
        table.insert(again, cur[4])
        table.insert(again, waited)
      end
    end
    return again
  end
end
if floor < 4 then
  local free = redis.call("HGETALL", p .. "free")
  for i = 1, #free, 2 do
    if free[i] ~= worker then
      local lanes, ts = string.match(free[i + 1], "^(%-?%d+)|(%d+)$")
      if lanes and tonumber(lanes) > 0 and now_ms - tonumber(ts) < 3000 then
        return {}
      end
    end
  end
end
local out = {}
for _ = 1, n do
  local best, best_key, best_c = nil, nil, nil
  for c = 0, 3 do
    local allowed = use[c] < caps[c]
    if floor < 4 and (c > 1 or c >= floor) then allowed = false end
    if allowed then
      local candidates, seen = {}, {}
      local function add(member, score)
        if not seen[member] then
          seen[member] = true
          table.insert(candidates, {member, tonumber(score)})
        end
      end
      local q = p .. "q:" .. c
      -- the jobs put back after a loss (their score heads the sorted set), the first PUT_BACK: each
      -- ranks by its score as an arrival in a class aging lifted it into, so the first of them is
      -- not always their best, and they must not hide the arrivals' own first and oldest
      local back = redis.call("ZRANGEBYSCORE", q, "-inf", REQUEUED, "WITHSCORES", "LIMIT", 0, PUT_BACK)
      for i = 1, #back, 2 do add(back[i], back[i + 1]) end
      local first = redis.call("ZRANGEBYSCORE", q, "(" .. REQUEUED, "+inf", "WITHSCORES", "LIMIT", 0, 1)
      if #first > 0 then
        add(first[1], first[2])
        -- the oldest arrival, past those put back that lead qa:C (#back / 2, or more than
        -- PUT_BACK: then the oldest may be missed while they wait)
        local qa = p .. "qa:" .. c
        for _, member in ipairs(redis.call("ZRANGE", qa, 0, #back / 2)) do
          local score = redis.call("ZSCORE", q, member)
          if not score then
            redis.call("ZREM", qa, member)  -- left the queue another way
          elseif tonumber(score) > REQUEUED then
            add(member, score)
            break
          end
        end
      end
      for _, cand in ipairs(candidates) do
        local member, score = cand[1], cand[2]
        local id = string.sub(member, 18)
        local f = redis.call("HMGET", p .. "job:" .. id, "arrival", "natural")
        local arrival = tonumber(f[1] or now_ms)
        local eff = c
        -- to preempt with (a floor), a job's own class decides, never its aged class: aging
        -- orders free lanes only, as in a worker's own queues (docs/scheduling.md)
        if starv > 0 and floor >= 4 then
          eff = math.max(0, c - math.floor((now_ms - arrival) / 1000.0 / starv))
        end
        -- a job put back after a loss heads its own class only: in a class it rose into it
        -- ranks by its score as an arrival, as any lifted job (a job enqueued before the
        -- score was kept has none: it heads that class too, as before)
        local ranked = score
        if eff ~= c and f[2] then
          ranked = tonumber(f[2])
        end
        -- (effective class, requeued first / score, arrival order); the score as lifted into
        -- the effective class (lower is better: the priority is subtracted), and its own
        local key = {eff, ranked - (ANCHOR[eff] - ANCHOR[c]), member, score}
        if best == nil or key[1] < best_key[1] or (key[1] == best_key[1] and (key[2] < best_key[2]
            or (key[2] == best_key[2] and key[3] < best_key[3]))) then
          best, best_key, best_c = id, key, c
        end
      end
    end
  end
  if best == nil then break end
  local jk = p .. "job:" .. best
  redis.call("ZREM", p .. "q:" .. best_c, best_key[3])
  redis.call("ZREM", p .. "qa:" .. best_c, best_key[3])
  local epoch = redis.call("HINCRBY", jk, "epoch", 1)
  -- its score kept: a draining worker may give it back to this place (giveback.lua)
  redis.call("HSET", jk, "state", "run", "worker", worker, "score", string.format("%.17g", best_key[4]))
  redis.call("ZADD", p .. "leases", now_ms + lease_ms, best)
  use[best_c] = use[best_c] + 1
  table.insert(out, best)
  table.insert(out, epoch)
  table.insert(out, redis.call("HGET", jk, "data"))
  local waited = -1
  if redis.call("HGET", jk, "requeued") ~= "1" then
    waited = math.max(0, now_ms - tonumber(redis.call("HGET", jk, "arrival") or now_ms))
  end
  table.insert(out, waited)
end
if token then
  local taken = {token}
  for i = 1, #out, 4 do
    table.insert(taken, out[i])
    table.insert(taken, out[i + 1])
    table.insert(taken, out[i + 3])
  end
  -- kept as long as a lease: a call sent again after that finds its jobs reaped anyway
  redis.call("SET", pk, cjson.encode(taken), "PX", lease_ms)
end
return out
