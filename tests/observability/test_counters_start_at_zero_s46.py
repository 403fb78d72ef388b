"""Counters whose label values are known and bounded have a sample for each from the start, 0
until it counts something: Prometheus's ``rate()`` and ``increase()`` over a series that does not
exist yet return nothing (an alert or a dashboard panel on them shows "no data" instead of 0, and
the first finish is lost to ``increase()``, which needs two samples)."""

from __future__ import annotations

from api.metrics import FINISH_REASONS, snapshot_families, worker_families
from scheduler.core.qos import QosClass


def jobs_finished(stats: dict[str, object]) -> dict[tuple[str, str], float]:
    [fam] = [f for f in worker_families(stats) if f.name == "superfluid_jobs_finished"]
    return {(s.labels["class"], s.labels["reason"]): s.value for s in fam.samples if s.name == "superfluid_jobs_finished_total"}


def test_jobs_finished_has_every_class_and_reason_before_any_job_finished() -> None:
    got = jobs_finished({})
    assert got == {(c.label, r): 0 for c in QosClass for r in FINISH_REASONS}


def test_jobs_finished_keeps_its_counts_beside_the_zeros() -> None:
    got = jobs_finished({"finished": {"agent": {"stop": 3, "deadline": 1}, "interactive": {"unknown": 2}}})
    assert got[("agent", "stop")] == 3 and got[("agent", "deadline")] == 1 and got[("interactive", "unknown")] == 2
    assert got[("background", "length")] == 0 and got[("completion", "cancelled")] == 0
    assert sum(got.values()) == 6


def test_a_fresh_worker_snapshot_has_every_labelled_counter_sampled() -> None:
    """The scheduler's labelled counters (by band, level, reason) already start at 0: kept so."""
    names = {"llamaswap_scheduler_dispatched", "superfluid_os_pressure", "llamaswap_scheduler_reorders", "superfluid_jobs_finished"}
    fams = {f.name: f for f in snapshot_families({}) if f.name in names}
    assert set(fams) == names
    for name, fam in fams.items():
        assert fam.samples and all(s.value == 0 for s in fam.samples), name
