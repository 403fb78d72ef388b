"""OS memory pressure ladder and completion start deadlines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scheduler.core.qos import QosClass
from scheduler.worker import pressure
from scheduler.worker.pressure import PSI_PATH, PressureMonitor, memory_psi_path, parse_psi, pressure_level, psi_reader

from .builders import finished, make_job, make_scheduler, run_until_idle, tick


def _cache_two_prefixes(sched, engine) -> None:  # type: ignore[no-untyped-def]
    for k in range(2):
        for i in range(2):
            job = make_job(5, job_id=f"p{k}-{i}", max_tokens=2)
            job.prompt = [100 + k] * 80 + job.prompt
            sched.add(job)
        run_until_idle(sched, engine)
        sched.clock.advance(1)


def test_warning_drops_host_prefixes_evicts_a_round_and_suspends_host_moves() -> None:
    sched, engine, clock = make_scheduler(max_batch=2, lane_ctx=256, cache_slots=1)
    _cache_two_prefixes(sched, engine)  # one slot: the first prefix went to host
    assert len(sched.pool.host_entries()) == 1 and len(sched.pool.device_entries()) == 1
    sched.on_os_pressure("warning")
    plan = sched.step()
    sched.commit(engine.execute(plan, lambda: False))
    assert sched.pool.host_entries() == []  # host copies dropped first
    assert sched.pool.device_entries() == []  # one eviction round, dropped (no host moves now)
    assert plan.pool.drop and not plan.pool.evict
    assert sched.snapshot()["counters"]["os_pressure_warning"] == 1


def test_critical_pressure_leaves_a_batch_invariant_lane_running() -> None:
    """A batch-invariant lane is never preempted, by a class or by memory pressure."""
    sched, engine, _ = make_scheduler(max_batch=2)
    sched.add(make_job(job_id="bi", qos=QosClass.BACKGROUND, max_tokens=50, batch_invariant=True))
    tick(sched, engine)
    tick(sched, engine)
    lane = sched.jobs["bi"].lane
    assert lane is not None and not sched.jobs["bi"].prefilling
    sched.on_os_pressure("critical")
    plan = sched.step()
    assert plan.release == [] and sched.jobs["bi"].lane == lane


def test_critical_also_preempts_decoding_background_lanes_but_not_others() -> None:
    sched, engine, clock = make_scheduler(max_batch=3)
    sched.add(make_job(job_id="bg", qos=QosClass.BACKGROUND, max_tokens=50))
    sched.add(make_job(job_id="agent", qos=QosClass.AGENT, max_tokens=50))
    sched.add(make_job(3000, job_id="bg-prefilling", qos=QosClass.BACKGROUND, max_tokens=50))
    tick(sched, engine)
    lanes = {j: sched.jobs[j].lane for j in ("bg", "agent", "bg-prefilling")}
    sched.on_os_pressure("critical")
    plan = sched.step()
    assert plan.release == [lanes["bg"]] and not plan.park  # no parking: memory is what is short
    assert sched.jobs["bg"].lane is None
    assert sched.jobs["agent"].lane == lanes["agent"]
    assert sched.jobs["bg-prefilling"].lane == lanes["bg-prefilling"]
    sched.commit(engine.execute(plan, lambda: False))
    tick(sched, engine)
    assert sched.jobs["bg"].lane is None  # background is held while the pressure lasts
    clock.advance(6)
    tick(sched, engine)
    assert sched.jobs["bg"].lane is None  # still critical: still held
    sched.on_os_pressure("normal")
    tick(sched, engine)
    clock.advance(4.5)
    tick(sched, engine)
    assert sched.jobs["bg"].lane is None  # and for 5 s after it ended (it was from its rise)
    clock.advance(1)
    tick(sched, engine)
    assert sched.jobs["bg"].lane is not None


def test_psi_levels() -> None:
    text = "some avg10=12.50 avg60=3.00 avg300=1.00 total=100\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    assert parse_psi(text) == (12.5, 0.0)
    assert pressure_level(12.5, 0.0) == "warning"
    assert pressure_level(60.0, 0.0) == "critical"
    assert pressure_level(5.0, 11.0) == "critical"
    assert pressure_level(1.0, 0.0) is None


def _psi_text(some: float, full: float = 0.0) -> str:
    return f"some avg10={some:.2f} avg60=0.00 avg300=0.00 total=0\nfull avg10={full:.2f} avg60=0.00 avg300=0.00 total=0\n"


@pytest.mark.parametrize(
    ("cgroup_line", "where"),
    [
        ("0::/", ""),  # a container with its own cgroup namespace: its cgroup is the mount's top
        ("0::/system.slice/superfluid.service", "system.slice/superfluid.service"),  # a systemd unit
        ("0::/docker/4f2a\n", "docker/4f2a"),
    ],
)
def test_the_pressure_read_is_the_workers_cgroups_where_cgroup_v2_has_one(tmp_path: Path, cgroup_line: str, where: str) -> None:
    """A container near its own memory limit stalls on reclaim while the host has memory to
    spare: /proc/pressure/memory (the host's) read normal, the cgroup's own file critical."""
    proc = tmp_path / "cgroup"
    proc.write_text(f"1:name=systemd:/\n{cgroup_line}\n")
    own = tmp_path / "fs" / where / "memory.pressure"
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_text(_psi_text(20.0, 15.0))
    assert memory_psi_path(proc, tmp_path / "fs") == own
    assert psi_reader(memory_psi_path(proc, tmp_path / "fs"))() == "critical"


@pytest.mark.parametrize("cgroup_text", ["0::/\n", "4:memory:/process_api/05f6\n0::/\n", "12:memory:/x\n", None])
def test_the_pressure_read_is_the_hosts_without_a_cgroup_file(tmp_path: Path, cgroup_text: str | None) -> None:
    """The root cgroup has no memory.pressure, cgroup v1 has no 0:: line, and /proc/self/cgroup may
    be unreadable: the host's /proc/pressure/memory, as before."""
    proc = tmp_path / "cgroup"
    if cgroup_text is not None:
        proc.write_text(cgroup_text)
    (tmp_path / "fs").mkdir()
    assert memory_psi_path(proc, tmp_path / "fs") == PSI_PATH


def test_the_workers_monitor_reads_its_cgroups_pressure_and_the_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The monitor a worker makes (no path given) finds the cgroup's file itself and reads it
    beside the host's: the higher figures count (a container at its own limit; a host short of
    memory, which what the worker frees helps too). Either file alone still reads; neither is
    no source, read as normal."""
    if sys.platform == "darwin":
        pytest.skip("macOS reads its sysctl, not PSI")
    proc, host = tmp_path / "cgroup", tmp_path / "host"
    proc.write_text("0::/box\n")
    own = tmp_path / "box" / "memory.pressure"
    own.parent.mkdir()
    monkeypatch.setattr(pressure, "PROC_CGROUP", proc)
    monkeypatch.setattr(pressure, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(pressure, "PSI_PATH", host)
    own.write_text(_psi_text(12.0))  # the container stalls at its limit
    host.write_text(_psi_text(0.5))  # the host has memory to spare
    monitor = PressureMonitor(interval_s=1.0)
    assert monitor.poll(0.0) == "warning"
    own.write_text(_psi_text(1.0))
    host.write_text(_psi_text(60.0))  # the host runs short
    assert monitor.poll(1.0) == "critical"
    host.unlink()
    assert monitor.poll(2.0) == "normal"  # the cgroup's file alone
    own.unlink()
    assert monitor.poll(3.0) is None  # neither: no source, normal (no change)


def test_a_psi_level_eases_only_a_fifth_below_the_threshold_that_raised_it(tmp_path: Path) -> None:
    """`some avg10` wobbling across 10 (9.9, 10.1, ...) read warning, normal, warning...: each
    rise ran an eviction round, one every other second under one steady load. A level now holds
    until its averages fall a fifth below its thresholds."""
    psi = tmp_path / "memory"
    read = psi_reader(psi)

    def reading(some: float, full: float = 0.0) -> str | None:
        psi.write_text(_psi_text(some, full))
        return read()

    monitor = PressureMonitor(read=lambda: reading(next(wobble)), interval_s=1.0)
    wobble = iter([9.9, 10.1, 9.9, 10.1, 9.9, 8.5, 7.9, 10.1])
    changes = [monitor.poll(float(t)) for t in range(8)]
    assert changes == [None, "warning", None, None, None, None, "normal", "warning"]
    assert [reading(55.0), reading(45.0), reading(39.0), reading(20.0, full=9.0), reading(20.0, full=7.0)] == [
        "critical", "critical", "warning", "warning", "warning",
    ]  # fmt: skip
    assert reading(7.0) is None  # a warning eases under 8
    assert [reading(9.0), reading(1.0, full=10.0), reading(1.0, full=8.0), reading(1.0, full=7.9)] == [None, "critical", "critical", None]


def test_a_completion_not_started_by_its_deadline_is_dropped_with_deadline() -> None:
    sched, engine, clock = make_scheduler(max_batch=1, preemption=False)
    sched.add(make_job(job_id="busy", max_tokens=40))
    tick(sched, engine)
    late = make_job(job_id="fim", qos=QosClass.COMPLETION, max_tokens=2)
    late.deadline_s = clock() + 0.5
    sched.add(late)
    events = run_until_idle(sched, engine)
    assert finished(events)["fim"] == "deadline"
    assert sched.snapshot()["counters"]["deadline_expired"] == 1
