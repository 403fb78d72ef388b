"""llama.cpp's extra buffer types (AMX, CPU weight repacking) on this machine: for each
``--repack`` setting and thread count, a child process loads the model into the llama.cpp engine
(``--lanes`` lanes), runs the worker's start-up decode, then times one prompt per lane and 32
decode rounds (best of three), and reports whether it crashed. The figures in docs/engines.md
(*Verified on an AMX Xeon*) come from this script.

    python bench/extra_bufts.py [--model PATH] [--threads 2,16] [--lanes 8]

``--cut N`` first writes a copy of the model with only its first N layers (same tensor types;
nonsense text, the same kernels), for moving a model to a machine with a transfer limit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

def child(model: str, mode: str, threads: int, lanes: int) -> None:
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.management.commands.checkengine import time_generation

    engine = LlamaCppEngine(model, n_lanes=lanes, lane_ctx=1024, n_threads=threads, repack=mode)
    engine.probe()
    result: dict[str, Any] = {"repack": engine.repack, "note": engine.repack_note}
    for n in sorted({1, lanes}):
        runs = [time_generation(engine, n, 32) for _ in range(3)]
        result[str(n)] = [max(r[0] for r in runs), max(r[1] for r in runs)]
    print("RESULT " + json.dumps(result), flush=True)


def cut(model: str, layers: int, out: str) -> None:
    """A copy of ``model`` with its first ``layers`` blocks only (gguf-py, from the gguf package
    or llama.cpp's gguf-py folder on PYTHONPATH)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(model)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out, arch=arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = layers if name == f"{arch}.block_count" else field.contents()
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= layers:
            continue
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="")
    parser.add_argument("--threads", default=f"2,{os.cpu_count() or 2}")
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--cut", type=int, default=0, help="use a copy with this many layers")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = args.model
    if not model:
        from scheduler.engines.models import default_model_path

        model = str(default_model_path())
    if args.child:
        child(model, args.child[0], int(args.child[1]), args.lanes)
        return
    if args.cut:
        cut_path = os.path.join(tempfile.mkdtemp(prefix="superfluid-cut-"), f"cut{args.cut}.gguf")
        cut(model, args.cut, cut_path)
        model = cut_path
    import llama_cpp

    print(f"llama.cpp system info: {llama_cpp.llama_print_system_info().decode().strip()}")
    print(f"model: {model}\n")
    n = args.lanes
    print(f"| --repack | threads | prefill tok/s, 1 lane | prefill tok/s, {n} lanes | decode tok/s, 1 lane | decode tok/s, {n} lanes |")
    print("|---|--:|--:|--:|--:|--:|")
    for threads in [int(t) for t in args.threads.split(",")]:
        for mode in ("auto", "off", "on"):
            argv = [sys.executable, __file__, "--model", model, "--lanes", str(n), "--child", mode, str(threads)]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                print(f"| {mode} | {threads} | exit {proc.returncode} | | | |")
                continue
            r = json.loads(line[7:])
            label = f"{mode} ({'on' if r['repack'] else 'off'})" if mode == "auto" else mode
            one, many = r["1"], r[str(n)]
            print(f"| {label} | {threads} | {one[0]:.0f} | {many[0]:.0f} | {one[1]:.0f} | {many[1]:.0f} |")


if __name__ == "__main__":
    main()
