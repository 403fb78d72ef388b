"""A Redis fleet's statistics as one worker's: what a head's /metrics and dashboard read.

Each worker of a fleet publishes its own snapshot (``metrics``: a
:class:`~scheduler.worker.metrics.WorkerStats`; ``counters``: the scheduler's; ``pool``: its KV
pool's figures). A head shows the fleet as one server, under the same metric names as a single
worker's, so the figures are merged field by field:

- counts, lanes, queue depths, pool blocks and rates add up (a histogram adds bucket by bucket;
  with another version's bounds, at the bounds both have);
- the longest waits and the largest step are the largest of any worker's; the tick number too;
- ``last_tick`` is the first worker's (by id), as one worker's last tick (the dashboard's Tick
  panel names it; /metrics has each worker's, from the snapshot's ``fleet``).

Counters must never go down, or Prometheus reads a reset and ``rate()`` spikes. A worker that
leaves the fleet (drained, crashed, its lease lapsed) takes its totals with it, so the head
carries them: :class:`FleetTotals` keeps what each departed worker had counted and adds it to
the live workers' sum. A worker whose id comes back (it stalled past its lease and published
again) is taken out of what is carried, since its own snapshot counts it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# WorkerStats fields whose merge is the largest value (per label for the dicts), not the sum
_LARGEST = frozenset({"queue_oldest_wait_s_by_class", "queue_oldest_wait_s_by_band", "prefill_step_tokens", "tick"})
_FIRST = frozenset({"last_tick"})  # one worker's, the first by id
# WorkerStats fields that only ever grow in a worker's life: carried when the worker leaves
STATS_COUNTERS = frozenset({
    "prefill_tokens_total", "decode_tokens_total", "prompt_tokens_total", "completion_tokens_total", "requests_total",
    "rejected_total", "engine_errors_total", "ticks_stopped_early_total", "finished", "ttft_s", "queue_wait_s", "tick_duration_s",
})  # fmt: skip
DEPARTED_KEPT = 1024  # departed worker ids remembered one by one; older ones stay in the sum only


def _is_histogram(value: Mapping[str, Any]) -> bool:
    return "le" in value and "buckets" in value


def _combine(a: Any, b: Any, largest: bool = False) -> Any:
    """``a`` and ``b`` merged: numbers added (or the larger, with ``largest``), dicts key by key,
    histograms bucket by bucket. Anything else (a string, a list of lanes) is ``a``."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if _is_histogram(a) and _is_histogram(b):
            # bounds of another version (a fleet mid-upgrade): the bounds both have, where each
            # cumulative count is exact; sum and count hold every observation either way
            theirs = dict(zip(b["le"], b["buckets"], strict=True))
            both = [(le, n + theirs[le]) for le, n in zip(a["le"], a["buckets"], strict=True) if le in theirs]
            return {
                "le": [le for le, _ in both],
                "buckets": [n for _, n in both],
                "sum": round(a["sum"] + b["sum"], 6),
                "count": a["count"] + b["count"],
            }
        merged = dict(a)
        for key, value in b.items():
            merged[key] = _combine(a[key], value, largest) if key in a else value
        return merged
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) or not isinstance(b, int | float):
        return a
    return max(a, b) if largest else a + b


def combine_by_label(a: Mapping[str, Any], b: Mapping[str, Any], largest: bool = False) -> dict[str, Any]:
    """Two ``{label: number}`` tables merged label by label: added, or the larger with ``largest``."""
    return dict(_combine(a, b, largest))


def merge_stats(stats: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """WorkerStats of several workers as one (the rules in the module's docstring)."""
    merged: dict[str, Any] = {}
    for one in stats:
        for field, value in one.items():
            if field not in merged:
                merged[field] = value
            elif field not in _FIRST:
                merged[field] = _combine(merged[field], value, largest=field in _LARGEST)
    return merged


def merge_numbers(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Flat tables of numbers (the scheduler's counters, the KV pool's figures) added key by key."""
    merged: dict[str, Any] = {}
    for part in parts:
        merged = _combine(merged, part)
    return merged


def counted(snapshot: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a worker's snapshot has counted for good: its counter statistics and its scheduler
    counters, (metrics, counters)."""
    stats: Mapping[str, Any] = snapshot.get("metrics") or {}
    return {k: v for k, v in stats.items() if k in STATS_COUNTERS}, dict(snapshot.get("counters") or {})


class FleetTotals:
    """One head's view of the fleet's figures, counters carried across workers that left."""

    def __init__(self) -> None:
        self._departed: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # worker id -> its totals when it left
        self._forgotten: tuple[dict[str, Any], dict[str, Any]] = ({}, {})  # totals of ids no longer remembered
        self._carried: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        self._last: dict[str, Mapping[str, Any]] = {}  # the workers of the last view

    def _carry(self) -> None:
        parts = [self._forgotten, *self._departed.values()]
        self._carried = (merge_stats(p[0] for p in parts), merge_numbers(p[1] for p in parts))

    def view(self, workers: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(metrics, counters, pool) of the fleet ``workers`` (worker id -> its last snapshot):
        the live workers merged, plus the counts of every worker that left since this head began."""
        changed = False
        for wid in self._last.keys() - workers.keys():
            self._departed[wid] = counted(self._last[wid])
            changed = True
        for wid in workers.keys() & self._departed.keys():  # back: its snapshot counts it again
            del self._departed[wid]
            changed = True
        while len(self._departed) > DEPARTED_KEPT:
            oldest = next(iter(self._departed))
            gone = self._departed.pop(oldest)
            self._forgotten = (merge_stats([self._forgotten[0], gone[0]]), merge_numbers([self._forgotten[1], gone[1]]))
        if changed:
            self._carry()
        self._last = dict(workers)
        live = [workers[wid] for wid in sorted(workers)]
        metrics = merge_stats([*(s.get("metrics") or {} for s in live), self._carried[0]])
        counters = merge_numbers([*(s.get("counters") or {} for s in live), self._carried[1]])
        pool = merge_numbers(s.get("pool") or {} for s in live)
        return metrics, counters, pool
