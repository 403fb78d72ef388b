"""The engine worker's loop (EngineWorker.handle / run_tick) on the simulated engine under random
traffic and faults: every job gets exactly one end, the text its prompt gives, usage that adds
up, lanes and cache slots holding what the scheduler thinks (tests/core/worker_fuzz.py lists the
actions and invariants)."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from .worker_fuzz import Fuzz


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), prepare=st.booleans(), utf8=st.booleans(), faults=st.booleans(), wide=st.booleans())
# a job resumed after '...t' whose new text began 'o', under stop ['to']: the worker stops at once
# (the stop string began in the text already sent), which the lone run must count too
@example(seed=2962, prepare=True, utf8=True, faults=False, wide=True)
def test_the_worker_loop_keeps_its_invariants_under_random_traffic_and_faults(seed: int, prepare: bool, utf8: bool, faults: bool, wide: bool) -> None:
    # wide: 4-8 lanes and longer jobs, where lane compaction makes several moves in one plan
    flags = {"prepare": float(prepare), "utf8": float(utf8), "wide": float(wide)}
    if faults:  # engine calls failing before any step or in a lane primitive; resubmissions after a link drop
        flags.update({"pre": 0.03, "prim": 0.02, "resubmit": 1.0})
    Fuzz(seed, flags).run(300)
