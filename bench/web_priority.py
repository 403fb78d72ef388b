"""Throughput with superfluid's web process at a lower CPU priority: one server, its web process's
threads (serve's own process, not the engine worker it starts) reniced to ``--nice`` and back
between alternating runs, the bare loop run beside each pair as the machine's reference. Lowering
it back to 0 needs root (CAP_SYS_NICE). Prints each run and the medians against the bare loop.

    python bench/web_priority.py [--nice 10] [--streams 8,1] [--repeat 3] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.throughput import bare_tps, prompts, server_tps  # noqa: E402
from scheduler.engines.models import default_model_path, model_name_for  # noqa: E402
from testkit.harness import RunningServer  # noqa: E402


def set_nice(pid: int, nice: int) -> None:
    """Every thread of ``pid`` to ``nice`` (Linux keeps a nice value per thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nice", type=int, default=10)
    parser.add_argument("--streams", default="8,1")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    model = model_name_for(default_model_path())
    srv = RunningServer("--max-batch", "8").start()
    assert srv.proc is not None
    rows: dict[tuple[int, str], list[float]] = {}
    take = 0
    try:
        server_tps(srv.base, model, prompts(2, take=999), 16)  # warm-up
        for rep in range(args.repeat):
            for n in streams:
                order = [("nice 0", 0), (f"nice {args.nice}", args.nice)]
                for label, nice in order if rep % 2 == 0 else order[::-1]:
                    set_nice(srv.proc.pid, nice)
                    take += 1
                    rows.setdefault((n, label), []).append(server_tps(srv.base, model, prompts(n, take=take), args.max_tokens))
                    print(f"repetition {rep + 1}, {n} streams, {label}: {rows[(n, label)][-1]:.1f} tok/s", flush=True)
                take += 1
                rows.setdefault((n, "bare"), []).append(bare_tps(default_model_path(), prompts(n, take=take), args.max_tokens))
                print(f"repetition {rep + 1}, {n} streams, bare loop: {rows[(n, 'bare')][-1]:.1f} tok/s", flush=True)
    finally:
        set_nice(srv.proc.pid, 0)
        srv.stop()
    print(f"\n| streams | superfluid at nice 0 / bare | superfluid at nice {args.nice} / bare |\n|--:|--:|--:|")
    for n in streams:
        bare = statistics.median(rows[(n, "bare")])
        at0 = statistics.median(rows[(n, "nice 0")]) / bare
        niced = statistics.median(rows[(n, f"nice {args.nice}")]) / bare
        print(f"| {n} | {at0:.3f} | {niced:.3f} |")


if __name__ == "__main__":
    main()
