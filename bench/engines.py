"""Each engine's own speed on the bundled model, driven directly with tick plans (no scheduler,
worker or HTTP): the llama.cpp engine on the SmolLM2-135M GGUF and the MLX engine on the same
model converted by ``manage.py mlxconvert`` (into a temporary folder), once with the GGUF's
quantised weights and once dequantised to float32 (``--dtype float32``). The MLX rows name the
BLAS MLX multiplies through (``SUPERFLUID_MLX_SYSTEM_BLAS=0`` keeps the one bundled with mlx).

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


ENGINES = ("llama.cpp", "MLX quantised", "MLX float32")


def open_engine(name: str, tmp: Path) -> Any:
    if name == "llama.cpp":
        from scheduler.engines.llama_cpp import LlamaCppEngine

        return LlamaCppEngine(default_model_path(), n_lanes=max(LANES), lane_ctx=512)
    from scheduler.engines.mlx import MlxEngine
    from scheduler.engines.mlx_convert import convert_gguf

    dtype = "float32" if name.endswith("float32") else None
    folder = convert_gguf(default_model_path(), tmp / (dtype or "quantised") / "SmolLM2-135M-Instruct-mlx", dtype=dtype)
    return MlxEngine(folder, n_lanes=max(LANES), lane_ctx=512)


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
    from scheduler.engines.mlx_runtime import blas_in_use

    with tempfile.TemporaryDirectory() as tmp:
        engines = {name: open_engine(name, Path(tmp)) for name in ENGINES}
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

    print(f"SmolLM2-135M-Instruct (GGUF Q4_1; MLX conversions of it), {args.rounds} decode rounds, median of {args.repeat}")
    print(f"MLX multiplies through {blas_in_use()}")
    print()
    print("| engine | lanes | prefill tok/s | decode tok/s | decode / llama.cpp's |")
    print("|:--|--:|--:|--:|--:|")
    for name in ENGINES:
        for lanes in LANES:
            prefill, decode = med(name, lanes, 0), med(name, lanes, 1)
            print(f"| {name} | {lanes} | {prefill:.1f} | {decode:.1f} | {decode / med('llama.cpp', lanes, 1):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
