-- What waits in the queue, for a head's metrics (read only): each class's longest wait, and
-- per priority band the requests waiting (the jobs of one request, n > 1, counted once) and
-- the longest wait, as a worker counts those of its own queue (scheduler/worker/metrics.py).
-- A job's wait is from its arrival (its head's wait before it, ``pre``, included); a job put
-- back after its worker was lost counts from when it was put back (``enq``), as a preempted one.
-- Jobs a head of an earlier version put there have neither field: from their arrival.
-- ARGV: prefix, band_half (a priority at or above it is interactive, at or below its negative batch)
-- Returns a JSON object: {"class": {"0": ms, ...}, "band": {"interactive": [n, ms], ...}}
local p, half = ARGV[1], tonumber(ARGV[2])
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local by_class, by_band, seen = {}, {}, {}
for _, b in ipairs({"interactive", "normal", "batch"}) do
  by_band[b] = {0, 0}
  seen[b] = {}
end
for c = 0, 3 do
  local oldest = 0
  for _, member in ipairs(redis.call("ZRANGE", p .. "q:" .. c, 0, -1)) do
    local id = string.sub(member, 18)
    local f = redis.call("HMGET", p .. "job:" .. id, "prio", "arrival", "requeued", "enq", "pre", "req")
    local since = tonumber(f[2]) or now_ms
    local before = tonumber(f[5]) or 0
    if f[3] == "1" then
      since, before = tonumber(f[4]) or since, 0
    end
    local waited = math.max(0, now_ms - since + before)
    oldest = math.max(oldest, waited)
    local prio = tonumber(f[1]) or 0
    local band = "normal"
    if prio >= half then band = "interactive" elseif prio <= -half then band = "batch" end
    local request = (f[6] and f[6] ~= "") and f[6] or id
    if not seen[band][request] then
      seen[band][request] = true
      by_band[band][1] = by_band[band][1] + 1
    end
    by_band[band][2] = math.max(by_band[band][2], waited)
  end
  by_class[tostring(c)] = oldest
end
return cjson.encode({class = by_class, band = by_band})
