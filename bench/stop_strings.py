"""The worker's cost of a client's stop strings, per generated token (scheduler/worker/output.py).

Stop strings run on the tick thread, every lane's: a token that costs a millisecond there costs
every stream that millisecond. This feeds ``TextStream`` the worst case a client can ask for
(``--stops`` stop strings of ``--stop-len`` "x", and output that follows them for ``--held``
characters, then breaks the match) and a usual one (four short stop strings, ordinary text), and
prints the cost of the token that breaks the long match and the median cost of a usual token.

    python bench/stop_strings.py [--stops 16] [--stop-len 500000] [--held 32000,128000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.worker.output import TextStream  # noqa: E402


def breaking_token_s(stops: int, stop_len: int, held: int) -> tuple[float, float]:
    """(seconds for the token that breaks the match, mean seconds per token while it held)."""
    stream = TextStream(lambda t: b"xxxx" if t == 0 else b"y", ["x" * (stop_len + i) for i in range(stops)])
    started = time.perf_counter()
    for _ in range(held // 4):
        stream.push(0)
    following = (time.perf_counter() - started) / (held // 4)
    started = time.perf_counter()
    out = stream.push(1)
    took = time.perf_counter() - started
    assert out == "x" * (held // 4 * 4) + "y"
    return took, following


def usual_token_s(tokens: int = 20_000) -> float:
    words = [f" word{i % 97}".encode() for i in range(tokens)]
    stream = TextStream(words.__getitem__, ["\n\n", "</s>", "User:", "###"])
    times = []
    for i in range(tokens):
        started = time.perf_counter()
        stream.push(i)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stops", type=int, default=16)
    parser.add_argument("--stop-len", type=int, default=500_000)
    parser.add_argument("--held", default="32000,128000")
    args = parser.parse_args()
    print("| stop strings | held characters | breaking token ms | mean ms per token while held |")
    print("|--:|--:|--:|--:|")
    for held in (int(h) for h in args.held.split(",")):
        took, following = breaking_token_s(args.stops, args.stop_len, held)
        print(f"| {args.stops} × {args.stop_len:,} \"x\" | {held:,} | {took * 1000:.3f} | {following * 1000:.4f} |")
    print(f"\nA usual token (4 short stop strings, ordinary text): median {usual_token_s() * 1e6:.1f} µs")


if __name__ == "__main__":
    main()
