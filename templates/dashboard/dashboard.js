/* superfluid live dashboard: plain JS, no build step, no network but this server. */
(function () {
  "use strict";
  var WINDOW_S = 120;          // chart span
  var RATE_WINDOW_S = 1.5;     // tokens/s are averaged over this much history
  var $ = function (id) { return document.getElementById(id); };
  var series = { decode: [], prefill: [], ttft: [] };
  var sources = {};            // worker (a push's totals[].source) -> {history: [{t, prefill, decode}], ttft, counters}
  var laneHist = {};           // lane -> [{t, job, generated}]
  var events = [];
  var EVENT_KINDS = [["preemptions", "preemption"], ["parks", "park"], ["resumes", "resume"],
                     ["evictions", "eviction"], ["host_imports", "host import"], ["os_pressure_warning", "OS pressure (warning)"],
                     ["os_pressure_critical", "OS pressure (critical)"]];

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) { e.setAttribute(k, attrs[k]); }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function fmt(n, digits) {
    if (n === null || n === undefined || isNaN(n)) { return "–"; }
    if (digits === undefined) { digits = n >= 100 ? 0 : 1; }
    return Number(n).toFixed(digits);
  }
  function clock(t) { return new Date(t * 1000).toLocaleTimeString(); }
  function trim(list, now) { while (list.length && list[0].t < now - WINDOW_S) { list.shift(); } }

  function rateOver(list, now, key) {
    var i = list.length - 1;
    if (i < 1) { return 0; }
    var j = i;
    while (j > 0 && list[j - 1].t >= now - RATE_WINDOW_S) { j--; }
    if (j === i) { j = i - 1; }
    var dt = list[i].t - list[j].t;
    return dt > 0 ? Math.max(0, (list[i][key] - list[j][key]) / dt) : 0;
  }

  function laneRate(lane, now) {
    var h = laneHist[lane.lane] || (laneHist[lane.lane] = []);
    if (lane.state === "idle" || !lane.job_id) { laneHist[lane.lane] = []; return 0; }
    if (h.length && h[h.length - 1].job !== lane.job_id) { h.length = 0; }
    h.push({ t: now, job: lane.job_id, generated: lane.generated || 0 });
    while (h.length && h[0].t < now - 10) { h.shift(); }
    return rateOver(h, now, "generated");
  }

  function renderLanes(s, now) {
    var box = $("lanes"), lanes = s.lanes || [];
    while (box.children.length > lanes.length) { box.removeChild(box.lastChild); }
    var busy = 0;
    lanes.forEach(function (lane, i) {
      var card = box.children[i];
      if (!card) {
        card = el("div", { "class": "lane" });
        card.innerHTML = '<div class="top"><span class="id"></span><span class="badge"></span></div>' +
          '<div class="meta cls"></div><div class="bar"><div></div></div><div class="nums"><span class="prog"></span><span class="rate"></span></div>';
        box.appendChild(card);
      }
      var state = lane.state;
      if (state !== "idle") { busy++; }
      card.setAttribute("data-lane", String(lane.lane));
      card.setAttribute("data-state", state);
      card.setAttribute("data-job", lane.job_id || "");
      card.querySelector(".id").textContent = "lane " + lane.lane + (lane.host !== undefined ? " · " + (lane.host || "?") : "");  // a fleet's: its worker's host
      var badge = card.querySelector(".badge");
      badge.textContent = state;
      badge.className = "badge " + state;
      var cls = card.querySelector(".cls"), bar = card.querySelector(".bar > div");
      var prog = card.querySelector(".prog"), rate = card.querySelector(".rate");
      var tps = laneRate(lane, now);
      if (state === "idle") {
        cls.textContent = "—";
        bar.style.width = "0";
        prog.textContent = "";
        rate.textContent = "";
        return;
      }
      var bits = [lane["class"] || "?"];
      bits.push("key " + (lane.key || "anonymous"));
      if (lane.priority) { bits.push("prio " + lane.priority); }
      if (lane.batch_invariant) { bits.push("invariant"); }
      if (lane.waiting_for_prefix) { bits.push("waiting for prefix"); }
      cls.textContent = bits.join(" · ");
      var pt = lane.prompt_tokens || 0, pd = lane.prompt_done || 0;
      if (lane.state === "prefill") {
        bar.style.width = (pt ? (100 * pd / pt) : 0).toFixed(1) + "%";
        prog.textContent = "prompt " + pd + " / " + pt + (lane.cached_tokens ? " (" + lane.cached_tokens + " cached)" : "");
        rate.textContent = "";
      } else {
        bar.style.width = "100%";
        prog.textContent = "generated " + (lane.generated || 0);
        rate.textContent = fmt(tps) + " tok/s";
      }
    });
    $("lanes-summary").textContent = busy + " of " + lanes.length + " busy";
  }

  function kvRows(table, rows) {
    table.innerHTML = "";
    rows.forEach(function (r) {
      var tr = el("tr");
      var a = el("td"), b = el("td");
      a.textContent = r[0];
      if (r[2] !== undefined) {
        var q = el("span", { "class": "qbar" });
        q.style.width = Math.min(120, 12 * r[2]) + "px";
        b.appendChild(q);
      }
      b.appendChild(document.createTextNode(String(r[1])));
      b.setAttribute("data-key", r[0]);
      tr.appendChild(a); tr.appendChild(b); table.appendChild(tr);
    });
  }

  function renderQueue(s) {
    var q = s.queue_depth || {}, total = 0, rows = [];
    ["interactive", "completion", "agent", "background"].forEach(function (c) {
      var n = q[c] || 0; total += n;
      var cap = (s.class_lanes || {})[c];
      rows.push([c + (cap ? " (cap " + cap + ")" : ""), n, n]);
    });
    rows.push(["total", total]);
    kvRows($("queue"), rows);
    // Redis mode: every job waiting for a lane, in Redis (the Fleet panel's global queue) and at the workers
    $("queue-scope").textContent = s.fleet ? "(fleet: in Redis and at the workers)" : "";
    var parked = s.parked || [];
    $("parked").textContent = parked.length ? parked.map(function (p) {
      return (p["class"] || "?") + " · " + String(p.job_id || "").slice(0, 8) + " · " + (p.tokens || 0) + " tokens";
    }).join("\n") : "none";
  }

  function renderPool(s) {
    var p = s.pool || {}, total = p.blocks_total || 0;
    var used = p.blocks_used || 0, cached = p.cached_blocks || 0, pinned = p.pinned_blocks || 0;
    var live = Math.max(0, used - cached);
    var segs = $("poolbar").children;
    function pct(n) { return total ? (100 * n / total).toFixed(2) + "%" : "0"; }
    segs[0].style.width = pct(live); segs[1].style.width = pct(Math.max(0, cached - pinned)); segs[2].style.width = pct(pinned);
    kvRows($("pool"), [
      ["used blocks", used + " / " + total + (total ? " (" + fmt(100 * used / total, 0) + "%)" : "")],
      ["cached blocks", cached], ["pinned blocks", pinned],
      ["prefixes on device", p.device_prefixes || 0], ["prefixes in host memory", p.host_prefixes || 0],
      ["host memory", fmt((p.host_bytes || 0) / 1048576) + " MiB"]
    ]);
  }

  // a fleet worker's id is "host:pid:tag": its pid, the field before the tag (a host holding a
  // colon, which a hostname cannot but the id's text may, does not shift it)
  function workerPid(id) {
    var parts = String(id || "").split(":");
    return parts.length >= 3 ? parts[parts.length - 2] : (parts[1] || "");
  }

  function renderTick(s) {
    var t = s.tick_info || {};
    // a fleet's budgets are every worker's, its tick and last tick the first worker's (by id): named
    var first = s.fleet && s.fleet.length > 1 ? s.fleet[0] : null;
    $("tick-no").textContent = "#" + (s.tick || 0) + (first ? " · last tick of " + (first.host || "?") + " · " + workerPid(first.worker) : "");
    kvRows($("tick"), [
      ["last tick: prefill tokens", t.last_prefill_tokens || 0],
      ["last tick: decode tokens", t.last_decode_tokens || 0],
      ["last tick: lanes fed", t.last_lanes || 0],
      ["last tick: duration", fmt(1000 * (t.last_seconds || 0), 0) + " ms"],
      ["prefill budget (next tick)", t.prefill_budget || 0],
      ["decode grant (next tick)", t.decode_grant || 0],
      ["prefill step", t.step_tokens || 0],
      ["measured prefill rate", fmt(s.prefill_tokens_per_s || 0, 0) + " tok/s"]
    ]);
  }

  // The rates, TTFT points and events are differences between two pushes of one worker's
  // cumulative counts (s.totals: every worker the push covers, by source; with several models one
  // per resident model). Each worker keeps its own baselines, so two workers' counts (two models,
  // or a worker and its restarted successor) are never compared; one no longer in a push is forgotten.
  function advance(s) {
    var now = s.t, seen = {};
    var step = { decode: 0, prefill: 0, ttftSum: 0, ttftCount: 0, events: [] };
    var totals = s.totals || [{ source: "", tokens: s.tokens, ttft: s.ttft, counters: s.counters }];
    totals.forEach(function (w) {
      var id = String(w.source || ""), tk = w.tokens || {}, tt = w.ttft || { sum: 0, count: 0 }, c = w.counters || {};
      var src = sources[id] || (sources[id] = { history: [], ttft: null, counters: null });
      seen[id] = true;
      src.history.push({ t: now, prefill: tk.prefill || 0, decode: tk.decode || 0 });
      trim(src.history, now);
      step.decode += rateOver(src.history, now, "decode");
      step.prefill += rateOver(src.history, now, "prefill");
      if (src.ttft && tt.count > src.ttft.count) {
        step.ttftSum += tt.sum - src.ttft.sum; step.ttftCount += tt.count - src.ttft.count;
      }
      src.ttft = tt;
      if (src.counters) {
        EVENT_KINDS.forEach(function (k) {
          var d = (c[k[0]] || 0) - (src.counters[k[0]] || 0);
          if (d > 0) { step.events.push(k[1] + (d > 1 ? " ×" + d : "") + (w.label ? " · " + w.label : "")); }
        });
      }
      src.counters = c;
    });
    Object.keys(sources).forEach(function (id) { if (!seen[id]) { delete sources[id]; } });
    return step;
  }

  function noteEvents(s, step) {
    step.events.forEach(function (text) { events.unshift({ t: s.t, text: text }); });
    events = events.slice(0, 40);
    var list = $("events");
    list.innerHTML = "";
    if (!events.length) { list.appendChild(el("li", { "class": "muted" }, "none yet")); return; }
    events.forEach(function (e) { list.appendChild(el("li", {}, clock(e.t) + "  " + e.text)); });
  }

  function drawChart(canvas, points, color, now) {
    var dpr = window.devicePixelRatio || 1, w = canvas.clientWidth || 520, h = canvas.clientHeight || 150;
    if (canvas.width !== Math.round(w * dpr)) { canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr); }
    var ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    var left = 44, bottom = h - 18, top = 8, right = w - 6;
    var max = 1;
    points.forEach(function (p) { if (p.v > max) { max = p.v; } });
    max = niceMax(max);
    ctx.strokeStyle = "#2a323c"; ctx.fillStyle = "#7d8894"; ctx.lineWidth = 1; ctx.font = "11px system-ui, sans-serif";
    for (var g = 0; g <= 4; g++) {
      var y = bottom - (bottom - top) * g / 4;
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(right, y); ctx.stroke();
      ctx.fillText(fmt(max * g / 4, max < 4 ? 2 : max < 40 ? 1 : 0), 4, y + 4);
    }
    ctx.fillText("-" + WINDOW_S + " s", left, h - 4);
    ctx.fillText("now", right - 22, h - 4);
    if (!points.length) { return; }
    var x = function (t) { return left + (right - left) * (1 - (now - t) / WINDOW_S); };
    var yv = function (v) { return bottom - (bottom - top) * Math.min(1, v / max); };
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
    points.forEach(function (p, i) { if (i === 0) { ctx.moveTo(x(p.t), yv(p.v)); } else { ctx.lineTo(x(p.t), yv(p.v)); } });
    ctx.stroke();
    ctx.fillStyle = color;
    if (points.length < 40) { points.forEach(function (p) { ctx.beginPath(); ctx.arc(x(p.t), yv(p.v), 2.5, 0, 6.3); ctx.fill(); }); }
  }
  function niceMax(v) {
    var p = Math.pow(10, Math.floor(Math.log10(v))), m = v / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }

  function renderCharts(s, step) {
    var now = s.t, dec = step.decode, pre = step.prefill;
    series.decode.push({ t: now, v: dec }); series.prefill.push({ t: now, v: pre });
    if (step.ttftCount > 0) {
      series.ttft.push({ t: now, v: 1000 * step.ttftSum / step.ttftCount });
    }
    trim(series.decode, now); trim(series.prefill, now); trim(series.ttft, now);
    $("decode-now").textContent = fmt(dec);
    $("prefill-now").textContent = fmt(pre);
    $("ttft-now").textContent = series.ttft.length ? fmt(series.ttft[series.ttft.length - 1].v, 0) : (s.last_ttft_ms ? fmt(s.last_ttft_ms, 0) : "–");
    drawChart($("chart-decode"), series.decode, "#3fb96b", now);
    drawChart($("chart-prefill"), series.prefill, "#e0a526", now);
    drawChart($("chart-ttft"), series.ttft, "#4aa3ff", now);
  }

  function renderFleet(s) {
    // Redis mode: every worker's lanes with its host (none: the fleet's last worker is gone), and
    // the queue in Redis by class
    if (!s.fleet) { return; }
    $("fleet-panel").hidden = false;
    var workers = s.fleet.map(function (w) {
      var busy = (w.lanes || []).filter(function (l) { return l.job_id; }).length;
      // a worker's own model where it is not the fleet's (a misconfigured or mid-upgrade fleet), and its drain
      var name = (w.host || "?") + " · " + workerPid(w.worker) +
        (w.model && w.model !== s.model ? " · " + w.model : "") + (w.draining ? " · draining" : "");
      return [name, busy + "/" + (w.n_lanes || 0) + " lanes busy", busy];
    });
    kvRows($("fleet"), workers.length ? workers : [["no worker", "0 lanes"]]);
    var q = s.global_queue || {}, rows = [];
    ["interactive", "completion", "agent", "background"].forEach(function (c) { rows.push([c, q[c] || 0, q[c] || 0]); });
    kvRows($("global-queue"), rows);
  }

  function renderModels(s) {
    // several models: every resident model's lanes, and what waits at the router by band
    if (!s.models) { return; }
    $("models-panel").hidden = false;
    $("router-panel").hidden = false;
    var box = $("models");
    var ids = s.models.map(function (m) { return m.id; });
    Array.prototype.slice.call(box.children).forEach(function (card) {
      if (ids.indexOf(card.getAttribute("data-model")) < 0) { box.removeChild(card); }
    });
    s.models.forEach(function (m) {
      // found by comparing the attribute, not a selector built from the id: CSS.escape turns a
      // U+0000 into U+FFFD, no card matched, and each push added one more for that model
      var card = Array.prototype.find.call(box.children, function (c) { return c.getAttribute("data-model") === m.id; });
      if (!card) {
        card = el("div", { "class": "model", "data-model": m.id });
        card.innerHTML = '<div class="top"><span class="name"></span><span class="badge"></span></div><div class="meta"></div><div class="chips"></div>';
        box.appendChild(card);
      }
      card.setAttribute("data-state", m.state);
      card.setAttribute("data-busy", String(m.lanes_in_use));
      card.querySelector(".name").textContent = m.id + (m.fim ? " (FIM)" : "");
      card.querySelector(".badge").textContent = m.state;
      card.querySelector(".meta").textContent = m.lanes_in_use + "/" + m.n_lanes + " lanes in use · " + m.waiting + " waiting";
      var chips = card.querySelector(".chips"), lanes = m.lanes || [];
      while (chips.children.length > lanes.length) { chips.removeChild(chips.lastChild); }
      lanes.forEach(function (lane, i) {
        var chip = chips.children[i] || chips.appendChild(el("span", { "class": "chip" }));
        chip.setAttribute("data-model-lane", String(lane.lane));
        chip.setAttribute("data-state", lane.state || "idle");
        chip.setAttribute("title", "lane " + lane.lane + ": " + (lane.state || "idle") + (lane["class"] ? " · " + lane["class"] : ""));
      });
    });
    var q = s.router_queue || {}, table = $("router-queue");
    table.innerHTML = "";
    ["interactive", "normal", "batch"].forEach(function (b) {
      var row = q[b] || { depth: 0, oldest_wait_s: 0 };
      var tr = el("tr", { "data-band": b });
      tr.appendChild(el("td", {}, b));
      tr.appendChild(el("td", { "class": "depth" }, String(row.depth)));
      tr.appendChild(el("td", {}, "oldest " + fmt(row.oldest_wait_s, 1) + " s"));
      table.appendChild(tr);
    });
  }

  function render(s) {
    $("model").textContent = !s.model && noWorkerRuns(s) ? "no model loaded" :
      (s.model || "?") + " · " + (s.engine || "") + " · " + (s.n_lanes || 0) + " lanes × " + (s.lane_ctx || 0) + " ctx" + (s.draining ? " · draining" : "");
    var now = s.t;
    renderLanes(s, now);
    renderQueue(s);
    renderFleet(s);
    renderModels(s);
    renderPool(s);
    renderTick(s);
    var step = advance(s);
    renderCharts(s, step);
    noteEvents(s, step);
    window.superfluidLastState = s;
  }

  // A live worker sends a snapshot ten times a second, idle or not, and each reaches the page
  // within a push interval; none for this long means the worker is gone (crashed, restarting,
  // loading) or stuck in one long step, and what the page shows is that old: it says so.
  var STALE_MS = 3000;
  var lastState = null;        // when the latest state arrived (ms, this page's clock); null: socket not open
  function markLive() {
    var conn = $("conn");
    conn.textContent = "live"; conn.setAttribute("data-status", "live");
    document.body.classList.remove("stale");
  }
  // With several models and none loaded no worker runs to send snapshots: nothing is old then.
  // s.models lists the resident models only: empty when none is; one loading has no worker yet.
  function noWorkerRuns(s) {
    return !!(s && s.models && !s.models.some(function (m) { return m.state === "loaded" || m.state === "draining"; }));
  }
  function markIfStale() {
    if (lastState === null || noWorkerRuns(window.superfluidLastState)) { return; }
    var age = Date.now() - lastState;
    if (age < STALE_MS) { return; }
    var conn = $("conn");
    conn.textContent = "no update for " + Math.floor(age / 1000) + " s"; conn.setAttribute("data-status", "stale");
    document.body.classList.add("stale");
  }
  setInterval(markIfStale, 500);

  function forbidden() {
    var conn = $("conn");
    conn.textContent = "not allowed: log in as staff"; conn.setAttribute("data-status", "forbidden");
  }
  // A handshake the server refused (the session ended, no longer staff) and a server that is
  // not there (restarting, loading its model) both close with 1006 before opening: the page's
  // own URL tells them apart (a redirect to the login page, or no answer at all).
  function whyClosed(ws) {
    fetch(location.pathname, { redirect: "manual", cache: "no-store", credentials: "same-origin" }).then(function (r) {
      if (ws !== socket) { return; }
      if (r.type === "opaqueredirect" || r.status === 401 || r.status === 403) { forbidden(); return; }
      var conn = $("conn");
      conn.textContent = "reconnecting"; conn.setAttribute("data-status", "closed");
    }, function () {
      if (ws !== socket) { return; }
      var conn = $("conn");
      conn.textContent = "server unreachable · reconnecting"; conn.setAttribute("data-status", "closed");
    });
  }

  var retry = 500, socket = null;
  function connect() {
    var conn = $("conn");
    var ws = socket = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws/dashboard/");
    var opened = false;
    ws.onopen = function () { opened = true; retry = 500; lastState = Date.now(); markLive(); };
    ws.onmessage = function (m) {
      var msg = JSON.parse(m.data);
      if (msg.type === "state") {
        // age_ms: the first state of a page opened while the worker is away is its last
        // snapshot, that old: shown as old at once, never as live
        var age = msg.age_ms || 0;
        if (conn.getAttribute("data-status") === "stale" && age < STALE_MS) { markLive(); }
        lastState = Date.now() - age;
        render(msg.state);
        markIfStale();
      }
    };
    ws.onclose = function (e) {
      lastState = null;
      document.body.classList.remove("stale");
      if (e.code === 4403) {
        forbidden();
      } else if (opened) {
        conn.textContent = "reconnecting"; conn.setAttribute("data-status", "closed");
      } else {
        // what the last try found out stays up until this one's answer replaces it
        if (conn.getAttribute("data-status") !== "forbidden" && conn.getAttribute("data-status") !== "closed") {
          conn.textContent = "reconnecting"; conn.setAttribute("data-status", "closed");
        }
        whyClosed(ws);
      }
      setTimeout(connect, retry);
      retry = Math.min(10000, retry * 2);
    };
  }
  connect();
})();
