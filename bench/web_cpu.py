"""The web process's CPU per streamed token, on each event loop ``serve`` can run.

On a machine whose cores llama.cpp's threads fill, every millisecond the web process spends on a
token is taken from the decode (docs/benchmarks.md). This starts one ``manage.py serve`` per
event loop (``SUPERFLUID_EVENT_LOOP``: uvloop, the default, and asyncio), then, alternating
between them, streams the same greedy completion at N concurrent streams and reads the web
process's CPU time (user + system, from /proc: Linux) before and after. The worker process is
not counted. Prints a table, medians over ``--repeat`` rounds.

    python bench/web_cpu.py [--streams 1,8] [--max-tokens 400] [--repeat 3] [--loops uvloop,asyncio]

An A/B of two checkouts: ``--tree NAME=PATH`` (twice or more) starts one server per checkout
(each checkout's own ``manage.py``, on each of ``--loops``) and alternates between them the same
way (the order reversed every other round); the table has a row per server and its ratio to the
first. The CPU time comes in ticks of 10 ms: give each round enough tokens that a tick is a small
part of it (``--max-tokens 400`` at one stream is ~20 ticks).

    python bench/web_cpu.py --loops uvloop --tree base=/tmp/base --tree new=.

An A/B of flags: ``--variant NAME=FLAGS`` (twice or more) starts one server of this checkout per
variant, with those flags added (``--variant every=`` for none), the same way.

    python bench/web_cpu.py --loops uvloop --variant every= --variant paced="--stream-interval-ms 50"

``--bare`` also runs the bare loop (``bench/bare_loop.py``, in this process, with the
llama-cpp-python it imports) on the same prompts in every round, before the servers, and adds
each server's throughput over the bare loop's, the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.throughput import bare_tps, one_stream, prompts, run_server  # noqa: E402
from scheduler.engines.models import default_model_path, model_name_for  # noqa: E402
from testkit.harness import RunningServer  # noqa: E402

LOOPS = ("uvloop", "asyncio")


class TreeServer(RunningServer):
    """``manage.py serve`` of another checkout (its own code, this one's harness)."""

    def __init__(self, root: Path, *flags: str, env: dict[str, str] | None = None) -> None:
        super().__init__(*flags, env=env)
        self.root = root.resolve()
        self.cwd = self.root

    def start(self, timeout_s: float = 120.0) -> TreeServer:
        self._launch([sys.executable, str(self.root / "manage.py"), "serve", "--port", str(self.port), *self.flags], timeout_s)
        self.wait_for(self._has_state, timeout_s=60)
        return self


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (its threads included, its children not)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(server: RunningServer, model: str, streams: int, max_tokens: int) -> tuple[float, float]:
    """(web CPU ms per completion token, aggregate tokens/s) for one round."""
    assert server.proc is not None
    before = cpu_seconds(server.proc.pid)
    run = run_server(server.base, model, prompts(streams), max_tokens)
    return (cpu_seconds(server.proc.pid) - before) * 1e3 / run["completion_tokens"], run["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,8")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--loops", default=",".join(LOOPS), help="event loops to run serve on (uvloop, asyncio)")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH", help="a checkout to serve from (A/B; repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS", help="this checkout with these serve flags added (A/B; repeatable)")
    parser.add_argument("--bare", action="store_true", help="also run the bare loop each round; report each server's tok/s over it")
    args = parser.parse_args()
    counts = [int(s) for s in args.streams.split(",")]
    loops = [loop for loop in args.loops.split(",") if loop]
    if any(loop not in LOOPS for loop in loops):
        parser.error(f"--loops: one of {', '.join(LOOPS)}")
    # (name, checkout, added flags): a checkout's path, or "" for this one
    trees = [(*t.split("=", 1), "") for t in args.tree] + [(v.split("=", 1)[0], "", v.split("=", 1)[1]) for v in args.variant]
    model = model_name_for(default_model_path())
    servers: dict[str, RunningServer] = {}
    for tree, path, added in trees or [("", "", "")]:
        flags = ("--max-batch", str(max(counts)), *shlex.split(added))
        for loop in loops:
            label = f"{tree} {loop}".strip()
            env = {"SUPERFLUID_EVENT_LOOP": loop}
            servers[label] = (TreeServer(Path(path), *flags, env=env) if path else RunningServer(*flags, env=env)).start()
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    bare: dict[int, list[float]] = {}
    try:
        for server in servers.values():
            one_stream(server.base, model, prompts(1)[0], 8)  # warm: first request, key runtime loaded
        for round_ in range(args.repeat):
            for n in counts:
                if args.bare:
                    bare.setdefault(n, []).append(bare_tps(default_model_path(), prompts(n), args.max_tokens))
                    print(f"round {round_ + 1} bare loop     {n} streams: {bare[n][-1]:.1f} tok/s", file=sys.stderr, flush=True)
                # the servers in turn, the order reversed every other round: a machine whose speed
                # drifts within a round favours neither
                order = list(servers.items())
                for label, server in order if round_ % 2 == 0 else order[::-1]:
                    ms, tps = measure(server, model, n, args.max_tokens)
                    results.setdefault((label, n), []).append((ms, tps))
                    print(
                        f"round {round_ + 1} {label:12} {n} streams: {ms:.3f} ms web CPU/token, {tps:.1f} tok/s",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for server in servers.values():
            server.stop()
    print(f"\nweb process CPU per streamed token, median of {args.repeat} ({args.max_tokens} tokens a stream)\n")
    first = next(iter(servers))
    print(f"| streams | server | ms/token | / {first} | tok/s |" + (" bare loop tok/s | / bare loop |" if args.bare else ""))
    print("|--:|:--|--:|--:|--:|" + ("--:|--:|" if args.bare else ""))
    for n in counts:
        base_ms = statistics.median(r[0] for r in results[(first, n)])
        for label in servers:
            ms = statistics.median(r[0] for r in results[(label, n)])
            tps = statistics.median(r[1] for r in results[(label, n)])
            row = f"| {n} | {label} | {ms:.3f} | {ms / base_ms:.2f} | {tps:.1f} |"
            if args.bare:
                ratio = statistics.median(r[1] / b for r, b in zip(results[(label, n)], bare[n], strict=True))
                row += f" {statistics.median(bare[n]):.1f} | {ratio:.3f} |"
            print(row)


if __name__ == "__main__":
    main()
