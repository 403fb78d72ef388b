"""Check that the installed engine runs on this machine: load the model as the worker does,
decode its start-up batch, then time a short generation. Exits non-zero if it cannot decode
(a crash of the engine kills the process with the signal, which a caller sees as well)."""

from __future__ import annotations

import sys
import time
from typing import Any

from django.core.management.base import CommandError

from scheduler.core.types import LaneBind, LaneFeed, SamplingParams, TickPlan
from scheduler.engines.base import EngineError
from scheduler.management.commands.runengine import _probe, load_engine
from scheduler.management.options import (
    FlagsCommand,
    add_engine_arguments,
    resolve_model,
    scheduler_config,
)

PROMPT = "Explain in a few sentences why the sky is blue."


def _never() -> bool:
    return False


def time_generation(engine: Any, lanes: int, rounds: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s): ``lanes`` lanes prefill one prompt each in one tick, then
    ``rounds`` greedy decode rounds of every lane, one tick each."""
    prompt = engine.tokenize(engine.render_chat([{"role": "user", "content": PROMPT}]))
    greedy = SamplingParams(temperature=0.0)
    plan = TickPlan(tick=0, step_tokens=max(512, lanes))
    for lane in range(lanes):
        plan.bind.append(LaneBind(lane=lane, job_id=f"check{lane}", sampling=greedy))
        plan.feeds.append(LaneFeed(lane=lane, job_id=f"check{lane}", start_pos=0, tokens=prompt, sample=True))
    t0 = time.perf_counter()
    result = engine.execute(plan, _never)
    t1 = time.perf_counter()
    last = dict(result.sampled)
    for i in range(rounds):
        plan = TickPlan(tick=1 + i)
        for lane in range(lanes):
            plan.feeds.append(
                LaneFeed(lane=lane, job_id=f"check{lane}", start_pos=len(prompt) + i, tokens=[last[lane]], sample=True, decode=True)
            )
        last = dict(engine.execute(plan, _never).sampled)
    t2 = time.perf_counter()
    engine.execute(TickPlan(tick=rounds + 1, release=list(range(lanes))), _never)
    return lanes * len(prompt) / (t1 - t0), lanes * rounds / (t2 - t1)


class Command(FlagsCommand):
    help = "Check that the engine loads the model and decodes on this machine, and print its speed."

    def add_arguments(self, parser: Any) -> None:
        add_engine_arguments(parser)
        parser.add_argument("--rounds", type=int, default=32, help="decode rounds to time (default: 32)")

    def handle(self, *args: Any, **options: Any) -> None:
        config = scheduler_config(options)
        if options["rounds"] < 1:  # 0 rounds printed "decode 0.0 tok/s", a negative count a negative speed
            raise CommandError(f"--rounds must be at least 1; got {options['rounds']}")
        model = resolve_model(options)
        out = self.stdout.write
        try:
            import llama_cpp

            out(f"llama-cpp-python {llama_cpp.__version__} from {llama_cpp.__file__}")
            out(f"llama.cpp system info: {llama_cpp.llama_print_system_info().decode('utf-8', 'replace').strip()}")
        except ImportError as exc:
            out(f"llama-cpp-python: not importable ({exc})")
        started = time.monotonic()
        engine = load_engine(
            options["engine"], model, n_lanes=config.max_batch, lane_ctx=min(config.lane_ctx, 1024),
            threads=options["threads"], cache_slots=0, repack=options["repack"], adapt_threads=options["adapt_threads"] == "on",
        )
        try:
            repack = getattr(engine, "repack", None)
            if repack is not None:
                note = getattr(engine, "repack_note", None)
                out(f"extra buffer types (AMX, weight repacking): {'on' if repack else 'off'} (--repack {options['repack']})")
                if note:
                    out(note)
            if engine.name == "mlx":
                from scheduler.engines.mlx_runtime import blas_in_use

                out(f"MLX multiplies through {blas_in_use()}")
            out(f"{model.name} on {engine.name}: loaded in {time.monotonic() - started:.1f}s")
            _probe(engine)  # the worker's start-up decode, test hook included
            out("start-up decode: ok")
            for lanes in sorted({1, config.max_batch}):
                prefill, decode = time_generation(engine, lanes, options["rounds"])
                out(f"{lanes} lane(s): prefill {prefill:.1f} tok/s, decode {decode:.1f} tok/s ({options['rounds']} rounds, greedy)")
        except EngineError as exc:
            raise CommandError(f"the engine cannot decode on this machine: {exc}") from None
        finally:
            engine.close()
        sys.stdout.flush()
