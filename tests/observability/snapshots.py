"""Worker snapshots for the observability tests: what a worker's link last heard from it."""

from __future__ import annotations

from typing import Any


def busy_worker(model: str, n_lanes: int, *, queues: dict[str, dict[str, Any]], admitted: int, **fields: Any) -> dict[str, Any]:
    """A worker's snapshot with every one of its ``n_lanes`` lanes decoding (jobs j1, j2, ...),
    ``queues`` (its queue figures: ``queue_depth_by_band`` and the like) waiting at it, and
    most of its KV pool in use (900 of 1000 blocks); ``fields``: more top-level fields (its pid)."""
    return {
        "model": model,
        **fields,
        "n_lanes": n_lanes,
        "lanes": [{"lane": lane, "state": "decode", "job_id": f"j{lane + 1}"} for lane in range(n_lanes)],
        "metrics": {
            "lanes_total": n_lanes,
            "lanes_by_state": {"idle": 0, "prefill": 0, "decode": n_lanes},
            **queues,
        },
        "counters": {"admitted": admitted},
        "pool": {"blocks_used": 900, "blocks_total": 1000},
    }
