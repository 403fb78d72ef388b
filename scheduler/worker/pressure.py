"""OS memory pressure from Linux PSI (``/proc/pressure/memory``).

PSI reports the share of time tasks stalled on memory over the last 10 s: ``some`` (at least one
task stalled) and ``full`` (all non-idle tasks stalled). superfluid maps the 10-second averages
to two levels:

- critical: ``full avg10 >= 10`` or ``some avg10 >= 50``
- warning:  ``some avg10 >= 10``

Where the file does not exist (no PSI, another OS) the monitor stays silent.
"""

from __future__ import annotations

from pathlib import Path

PSI_PATH = Path("/proc/pressure/memory")
WARNING_SOME = 10.0
CRITICAL_SOME = 50.0
CRITICAL_FULL = 10.0


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


def pressure_level(some_avg10: float, full_avg10: float) -> str | None:
    if full_avg10 >= CRITICAL_FULL or some_avg10 >= CRITICAL_SOME:
        return "critical"
    if some_avg10 >= WARNING_SOME:
        return "warning"
    return None


class PressureMonitor:
    def __init__(self, path: Path = PSI_PATH, interval_s: float = 1.0) -> None:
        self.path = path
        self.interval_s = interval_s
        self._next = 0.0
        self.last: tuple[float, float] | None = None

    def poll(self, now: float) -> str | None:
        """The current level, read at most once per interval (None between reads)."""
        if now < self._next:
            return None
        self._next = now + self.interval_s
        try:
            self.last = parse_psi(self.path.read_text())
        except (OSError, ValueError):
            return None
        return pressure_level(*self.last)
