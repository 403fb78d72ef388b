"""OS memory pressure: Linux PSI (``/proc/pressure/memory``, and the worker's cgroup's
``memory.pressure`` under cgroup v2) or macOS's ``kern.memorystatus_vm_pressure_level``.

In a container, or a systemd unit with a ``MemoryMax``, ``/proc/pressure/memory`` is the whole
host's: a container near its own limit, stalling on reclaim, read as no pressure there while the
host had memory to spare. The cgroup's own file counts the stalls of the worker's cgroup. Both
are read and the higher figures count: the container's limit, and the host's pressure, which
what the worker frees helps too.

PSI reports the share of time tasks stalled on memory over the last 10 s: ``some`` (at least one
task stalled) and ``full`` (all non-idle tasks stalled). superfluid maps the 10-second averages
to two levels:

- critical: ``full avg10 >= 10`` or ``some avg10 >= 50``
- warning:  ``some avg10 >= 10``

macOS (the MLX engine's platform) states the level itself: the sysctl is 1 (normal), 2 (warning)
or 4 (critical).

A level eases only once its figures fall a fifth below the thresholds that raised it (warning
holds while ``some avg10 >= 8``; critical while ``full avg10 >= 8`` or ``some avg10 >= 40``): at
a threshold the average wobbles across it (9.9, 10.1, 9.9...), and each rise runs an eviction
round, so without the margin one steady load evicted a round every other second.

The monitor reads once a second and reports *changes* only (``warning``, ``critical``, or
``normal`` when it eases): the scheduler acts on a rise, not on every reading of a level that
stays high. Where neither source exists the monitor stays silent.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from collections.abc import Callable
from pathlib import Path

PSI_PATH = Path("/proc/pressure/memory")
PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
WARNING_SOME = 10.0
CRITICAL_SOME = 50.0
CRITICAL_FULL = 10.0
MACOS_SYSCTL = b"kern.memorystatus_vm_pressure_level"
MACOS_LEVELS = {1: None, 2: "warning", 4: "critical"}


def parse_psi(text: str) -> tuple[float, float]:
    """(some avg10, full avg10) from the PSI file's text."""
    values = {"some": 0.0, "full": 0.0}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for field in rest.split():
            name, _, value = field.partition("=")
            if name == "avg10" and kind in values:
                values[kind] = float(value)
    return values["some"], values["full"]


EASE = 0.8  # a level holds until its figures fall below this share of the thresholds that raised it


def pressure_level(some_avg10: float, full_avg10: float, current: str | None = None) -> str | None:
    """The level for the averages; ``current``: the level read before, which holds until the
    averages fall a fifth below the thresholds that raised it."""
    hold = EASE if current == "critical" else 1.0
    if full_avg10 >= CRITICAL_FULL * hold or some_avg10 >= CRITICAL_SOME * hold:
        return "critical"
    if some_avg10 >= WARNING_SOME * (EASE if current is not None else 1.0):
        return "warning"
    return None


def macos_level(value: int) -> str | None:
    """The level for a ``kern.memorystatus_vm_pressure_level`` value (unknown values: normal)."""
    return MACOS_LEVELS.get(value)


def read_macos_sysctl() -> int:
    """``kern.memorystatus_vm_pressure_level`` through libc's sysctlbyname; OSError if unreadable."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    value = ctypes.c_int(0)
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if libc.sysctlbyname(MACOS_SYSCTL, ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)) != 0:
        raise OSError(ctypes.get_errno(), "sysctlbyname kern.memorystatus_vm_pressure_level failed")
    return value.value


def memory_psi_path(proc_cgroup: Path | None = None, cgroup_root: Path | None = None) -> Path:
    """This process's cgroup v2 ``memory.pressure`` (the ``0::`` line of ``/proc/self/cgroup``
    under the v2 mount; in a container with its own cgroup namespace that line is ``0::/`` and the
    file is at the mount's top), where it exists; else the host's ``/proc/pressure/memory`` (the
    root cgroup, which has no such file, and cgroup v1)."""
    try:
        lines = (proc_cgroup or PROC_CGROUP).read_text().splitlines()
    except OSError:
        return PSI_PATH
    for line in lines:
        if line.startswith("0::"):
            candidate = (cgroup_root or CGROUP_ROOT) / line[3:].strip().lstrip("/") / "memory.pressure"
            if candidate.is_file():
                return candidate
    return PSI_PATH


def read_psi(path: Path | tuple[Path, ...] = PSI_PATH, current: str | None = None) -> str | None:
    """The level of one PSI file, or of several (the higher ``some`` and ``full`` of those that
    can be read; OSError when none can)."""
    paths = (path,) if isinstance(path, Path) else path
    readings = []
    for each in paths:
        with contextlib.suppress(OSError):
            readings.append(parse_psi(each.read_text()))
    if not readings:
        raise OSError(f"no PSI file could be read: {', '.join(map(str, paths))}")
    return pressure_level(max(r[0] for r in readings), max(r[1] for r in readings), current)


def psi_reader(path: Path | tuple[Path, ...] = PSI_PATH) -> Callable[[], str | None]:
    """PSI's level, each reading given the one before (the margin before a level eases); a
    reading that fails leaves no level to hold."""
    last: str | None = None

    def read() -> str | None:
        nonlocal last
        current, last = last, None  # (a reading that raises leaves none)
        last = read_psi(path, current)
        return last

    return read


def default_reader(path: Path | None = None) -> Callable[[], str | None]:
    if sys.platform == "darwin":
        return lambda: macos_level(read_macos_sysctl())
    if path is not None:
        return psi_reader(path)
    own = memory_psi_path()
    return psi_reader(PSI_PATH if own == PSI_PATH else (own, PSI_PATH))


class PressureMonitor:
    def __init__(
        self, path: Path | None = None, interval_s: float = 1.0, read: Callable[[], str | None] | None = None
    ) -> None:
        self.read = read or default_reader(path)
        self.interval_s = interval_s
        self._next = 0.0
        self.level: str | None = None  # the level last read

    def poll(self, now: float) -> str | None:
        """Read at most once per interval; return the level when it changed since the last
        reading ("warning", "critical", or "normal"), else None (also between reads). A source
        that cannot be read reads as normal, as where there is none."""
        if now < self._next:
            return None
        self._next = now + self.interval_s
        try:
            level = self.read()
        except (OSError, ValueError, AttributeError):
            level = None  # an unreadable source is no source: never stuck at its last reading
        if level == self.level:
            return None
        self.level = level
        return level or "normal"
