"""Each engine's own speed on the bundled model, driven directly with tick plans (no scheduler,
worker or HTTP): the llama.cpp engine on the SmolLM2-135M GGUF and the MLX engine on the same
model converted by ``manage.py mlxconvert`` (into a temporary folder).

For N = 1, 4, 8 lanes: one tick prefills every lane's short chat prompt (~27 tokens), then
``--rounds`` decode rounds of all N lanes, one tick each. Prefill tok/s is prompt tokens over the
prefill tick; decode tok/s is N x rounds over the decode ticks. Engines run one after the other,
``--repeat`` times interleaved; the table shows medians and MLX / llama.cpp ratios.

    python bench/engines.py --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.engines.models import default_model_path  # noqa: E402
from testkit.engine_driver import Run, chat, drive, release  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Why is the sky blue?",
             "Give me a recipe for pancakes.", "Describe how a bicycle works.", "What causes the seasons?",
             "List three prime numbers.", "Explain photosynthesis simply."]
LANES = (1, 4, 8)


def open_engine(name: str, mlx_dir: Path) -> Any:
    if name == "llamacpp":
        from scheduler.engines.llama_cpp import LlamaCppEngine

        return LlamaCppEngine(default_model_path(), n_lanes=max(LANES), lane_ctx=512)
    from scheduler.engines.mlx import MlxEngine

    return MlxEngine(mlx_dir, n_lanes=max(LANES), lane_ctx=512)


def measure(engine: Any, lanes: int, rounds: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) for ``lanes`` lanes."""
    runs = [Run(i, chat(engine, QUESTIONS[i % len(QUESTIONS)]), max_tokens=rounds + 1) for i in range(lanes)]
    t0 = time.perf_counter()
    drive(engine, runs, ticks=1)  # every prompt, and each lane's first token
    t1 = time.perf_counter()
    drive(engine, runs)  # ``rounds`` decode rounds
    t2 = time.perf_counter()
    release(engine, *range(lanes))
    return sum(len(r.prompt) for r in runs) / (t1 - t0), lanes * rounds / (t2 - t1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from scheduler.engines.mlx_convert import convert_gguf

    with tempfile.TemporaryDirectory() as tmp:
        mlx_dir = convert_gguf(default_model_path(), Path(tmp) / "SmolLM2-135M-Instruct-mlx")
        engines = {name: open_engine(name, mlx_dir) for name in ("llamacpp", "mlx")}
        results: dict[tuple[str, int], list[tuple[float, float]]] = {}
        try:
            for engine in engines.values():  # warm-up: first calls compile and allocate
                measure(engine, 1, 2)
            for i in range(args.repeat):
                for lanes in LANES:
                    for name, engine in engines.items():
                        results.setdefault((name, lanes), []).append(measure(engine, lanes, args.rounds))
                print(f"  run {i + 1} done", file=sys.stderr)
        finally:
            for engine in engines.values():
                engine.close()

    def med(name: str, lanes: int, which: int) -> float:
        return statistics.median(r[which] for r in results[(name, lanes)])

    print(f"SmolLM2-135M-Instruct (GGUF Q4_1; MLX conversion of it), {args.rounds} decode rounds, median of {args.repeat}")
    print()
    print("| lanes | llama.cpp prefill tok/s | MLX prefill tok/s | llama.cpp decode tok/s | MLX decode tok/s | MLX / llama.cpp decode |")
    print("|--:|--:|--:|--:|--:|--:|")
    for lanes in LANES:
        lp, mp, ld, md = med("llamacpp", lanes, 0), med("mlx", lanes, 0), med("llamacpp", lanes, 1), med("mlx", lanes, 1)
        print(f"| {lanes} | {lp:.1f} | {mp:.1f} | {ld:.1f} | {md:.1f} | {md / ld:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
