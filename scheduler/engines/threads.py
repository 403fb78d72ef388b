"""How many compute threads the next engine step uses, chosen by measuring.

llama.cpp splits every graph node of a step across its threads and waits at a barrier after
each. On a machine whose cores are all busy (another inference process, a compiler, this
server's own web process under many streams) a descheduled thread holds every other one at
the next barrier: measured on two cores under load, 2 threads decoded at 0.1-0.6 tok/s where
1 thread decoded at 9-28 tok/s (``docs/benchmarks.md``). On a quiet machine the opposite holds
(2 threads ~1.8x one). So the count is not a constant: the governor watches each step's cost
per token against the fastest seen for that kind of step, and when steps turn slow it tries
fewer threads on the next step of the same kind and keeps them if that step is faster; while
below the maximum it tries one more now and then, and goes back up when that is faster.

One count serves every kind of step (busy cores slow them all), but a count found faster on one
kind need not be faster on another: one thread can match two on a one-lane decode round, the
cheapest step (the chat's, beside eight agents, or the last agent's), and run a 512-token
prompt step at half the speed. So after a switch, the first step of each other kind with the
new count is set beside that kind's cost with the old one, measured just before the switch (so
on the same cores), or else in a step with the old count run just before: clearly slower, and
that kind keeps the old count until the next switch, or until it turns slow with it. Without
this, a switch found on the chat's rounds put the agents' prompt steps on one thread for 100 s
of an agents' run on the AMX Xeon (66 s against 43 s).

Pure Python and clock-driven, so its rules are tested without an engine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# A step whose cost per token is this many times the fastest seen for its kind is slow (busy
# cores measured 3-25x; a long context or a burst of the web process alone stays well below).
SLOW_FACTOR = 2.0
# A probe with another count wins when its cost per token is below this fraction of the current's.
WIN_FACTOR = 0.85
# ... but while other processes keep cores busy (OtherCpu), a probe with fewer threads wins when it
# is faster at all: on shared cores fewer threads is the likely better count and frees a core, and
# the margin it wins by there is small (one thread 13% faster than two beside a busy loop on one of
# two cores, on the AVX-512 EPYC: WIN_FACTOR kept two threads through whole runs, 79 s against 68 s).
BUSY_WIN_FACTOR = 1.0
# After a slow-step probe, no other for this long, twice as long after each that lost (a prompt
# step with fewer threads is a slow step), back to this after a switch. Explorations that lose
# do not lengthen it: busy cores that begin after an hour of quiet are answered in seconds.
PROBE_COOLDOWN_S = 10.0
# Exploring: now and then one decode round (the cheapest step) runs with another count (each in
# turn), so a change that the step times do not show as a slowdown is found too:
# first after this long, twice as long after each exploration that lost, back to this after a switch.
EXPLORE_S = 15.0
EXPLORE_MAX_S = 240.0
EMA = 0.5  # weight of the newest step in a kind's running cost
# Other processes using this many cores (a busy loop, a build, another server: from /proc on
# Linux) count as busy cores as well as slow steps do: cores busy from before the server's
# first step never show as steps slower than the fastest seen (session 15's hog runs stayed on
# two threads for two minutes of prompt steps, 155 s against llama-server's 121 s).
OTHERS_BUSY_CORES = 0.5
OTHERS_SAMPLE_S = 1.0
# After a switch, each other kind's first step with the new count is set beside its cost with
# the old count, if that was measured at most this long before the switch (the same cores).
FRESH_S = 10.0
# A probe or challenger whose kind of step has not come again in this long, and this many steps
# of other kinds, is dropped: while one waits, nothing else is tried (a chat's one-lane rounds
# end with the chat; the eight agents' rounds come only at the end of their prompts).
PENDING_S = 10.0
PENDING_STEPS = 5


def step_kind(prefill: bool, n_tokens: int) -> str:
    """Steps of one kind cost about the same per token: decode rounds by their lane count,
    prompt steps by their size in powers of two."""
    if not prefill:
        return f"decode/{n_tokens}"
    return f"prefill/{1 << max(0, n_tokens - 1).bit_length()}"


def candidates(max_threads: int) -> list[int]:
    """The counts tried, most first: all, one fewer (a core taken by someone else), one."""
    return sorted({max_threads, max(1, max_threads - 1), 1}, reverse=True)


@dataclass
class ThreadGovernor:
    max_threads: int
    clock: Callable[[], float] = time.monotonic
    current: int = 0
    best: dict[str, float] = field(default_factory=dict)  # kind -> fastest cost per token at the maximum
    recent: dict[tuple[int, str], float] = field(default_factory=dict)  # (threads, kind) -> running cost per token
    recent_at: dict[tuple[int, str], float] = field(default_factory=dict)  # (threads, kind) -> when last measured
    probe: tuple[int, str] | None = None  # (threads, kind): the next step of that kind runs with them
    # (threads, kind, cost) of a probe that beat the current count's running cost: the next
    # step of that kind, with the current count, says whether it still does (a slow step that
    # set the probe off may have been a passing one)
    challenger: tuple[int, str, float] | None = None
    last_probe_s: float = float("-inf")
    pending_since: float = float("-inf")  # when the probe, or the challenger, was set
    pending_steps: int = 0  # steps of other kinds since then
    exploring: bool = False  # the probe, or the challenger, is an exploration (no step was slow)
    others_busy: bool = False  # other processes keep cores busy (set by the engine: OtherCpu)
    explore_every_s: float = EXPLORE_S
    cooldown_s: float = PROBE_COOLDOWN_S
    switches: int = 0
    # kinds that ran clearly slower with the count switched to than with the one before, and
    # keep that one until the next switch (or until they turn slow with it)
    kept: dict[str, int] = field(default_factory=dict)
    # since the last switch: (the count before, when, the kinds already set beside it)
    switched: tuple[int, float, set[str]] | None = None
    _explored: int = 0  # explorations so far: they take the other counts in turn

    def __post_init__(self) -> None:
        self.max_threads = max(1, self.max_threads)
        self.current = self.current or self.max_threads
        self.next_explore_s = self.clock() + self.explore_every_s

    def threads_for(self, kind: str) -> int:
        """The thread count for the next step, of ``kind``."""
        if self.probe is not None and self.probe[1] == kind:
            return self.probe[0]
        if kind in self.kept:
            return self.kept[kind]
        if self.switched is not None and self._needs_reference(kind):
            return self.switched[0]
        return self.current

    def _needs_reference(self, kind: str) -> bool:
        """Since the last switch, ``kind`` has not run, and its cost with the count before was
        not measured just before the switch: its next step runs with that count, to be set
        beside the one after it, with the count switched to."""
        assert self.switched is not None
        before, switched_at, seen = self.switched
        return kind not in seen and self.recent_at.get((before, kind), float("-inf")) < switched_at - FRESH_S

    def observe(self, threads: int, kind: str, seconds: float, n_tokens: int) -> None:
        """A step of ``kind`` ran ``n_tokens`` with ``threads`` in ``seconds``."""
        if n_tokens <= 0 or seconds <= 0:
            return
        cost = seconds / n_tokens
        now = self.clock()
        if self.probe is not None or self.challenger is not None:
            self.pending_steps += 1
            if self.pending_steps > PENDING_STEPS and now - self.pending_since > PENDING_S:
                self.probe = self.challenger = None  # its kind did not come again
        if self.probe == (threads, kind):
            self._settle_probe(threads, kind, cost, now)
            return
        if kind in self.kept:
            self._observe_kept(threads, kind, cost, now)
            return
        if self.switched is not None and threads == self.switched[0] != self.current and kind not in self.switched[2]:
            self._record(threads, kind, cost, now, running=False)  # a reference step (_needs_reference)
            return
        if threads != self.current:
            return
        if self._keeps_old_count(kind, cost, now):
            return
        if self.challenger is not None and self.challenger[1] == kind:
            self._settle_challenger(cost, now)
        self._record(threads, kind, cost, now)
        if self.probe is not None or self.challenger is not None:
            return
        counts = candidates(self.max_threads)
        i = counts.index(self.current) if self.current in counts else 0
        slow = self._slow(threads, kind) or (self.others_busy and self.current == self.max_threads)
        if slow and i + 1 < len(counts) and now - self.last_probe_s >= self.cooldown_s:
            self.probe = (counts[i + 1], kind)  # steps turned slow: try fewer threads
            self.pending_since, self.pending_steps, self.exploring = now, 0, False
        elif kind.startswith("decode/") and now >= self.next_explore_s and len(counts) > 1:
            others = [c for c in counts if c != self.current]
            self._explored += 1
            self.probe = (others[self._explored % len(others)], kind)
            self.pending_since, self.pending_steps, self.exploring = now, 0, True

    def _settle_probe(self, threads: int, kind: str, cost: float, now: float) -> None:
        self.probe = None
        self._record(threads, kind, cost, now, running=False)
        current = self.recent.get((self.current, kind))
        if current is not None and cost < self._win_factor(threads) * current:
            self.challenger = (threads, kind, cost)  # confirmed, or not, by the next step
            self.pending_since, self.pending_steps = now, 0
        else:
            self._lost(now)

    def _settle_challenger(self, cost: float, now: float) -> None:
        """The current count's step right after a winning probe: the probe's count takes over
        if it still beats this fresh measure."""
        assert self.challenger is not None
        threads, kind, challenger_cost = self.challenger
        self.challenger = None
        if challenger_cost < self._win_factor(threads) * cost:
            self.switched = (self.current, now, {kind})
            self.kept = {}
            self.current = threads
            self.switches += 1
            self.explore_every_s, self.cooldown_s = EXPLORE_S, PROBE_COOLDOWN_S
            self.last_probe_s = now
            self.next_explore_s = now + self.explore_every_s
        else:
            self._lost(now)

    def _win_factor(self, threads: int) -> float:
        """The fraction of the current count's cost a try with ``threads`` must beat to take over."""
        return BUSY_WIN_FACTOR if self.others_busy and threads < self.current else WIN_FACTOR

    def _keeps_old_count(self, kind: str, cost: float, now: float) -> bool:
        """The first step of ``kind`` with the count switched to: if it ran clearly slower than
        ``kind`` did with the count before, measured just before the switch, ``kind`` keeps that
        one (a count found on one kind of step, say the chat's one-lane decode rounds, need not
        suit another, say 512-token prompt steps)."""
        if self.switched is None:
            return False
        before, switched_at, seen = self.switched
        if kind in seen:
            return False
        seen.add(kind)
        old_cost = self.recent.get((before, kind))
        fresh = self.recent_at.get((before, kind), float("-inf")) >= switched_at - FRESH_S
        if old_cost is None or not fresh or WIN_FACTOR * cost <= old_cost:
            return False
        self.kept[kind] = before
        return True

    def _observe_kept(self, threads: int, kind: str, cost: float, now: float) -> None:
        """A step of a kind that kept its count: it follows the others again once it turns slow
        with it (the cores it was measured on before the switch are busy now)."""
        if threads != self.kept[kind]:
            return
        self._record(threads, kind, cost, now)
        if self._slow(threads, kind):
            del self.kept[kind]

    def _record(self, threads: int, kind: str, cost: float, now: float, *, running: bool = True) -> None:
        """A step's cost per token: into the kind's running cost with ``threads`` (or in its
        place: a probe's or a reference step's, one step that stands alone) and, with all
        threads, its fastest."""
        key = (threads, kind)
        self.recent[key] = EMA * cost + (1 - EMA) * self.recent[key] if running and key in self.recent else cost
        self.recent_at[key] = now
        if running and threads == self.max_threads:
            self.best[kind] = min(self.best.get(kind, cost), cost)

    def _slow(self, threads: int, kind: str) -> bool:
        """The kind's running cost with ``threads`` is SLOW_FACTOR times its fastest or more."""
        best = self.best.get(kind)
        return best is not None and self.recent[(threads, kind)] > SLOW_FACTOR * best

    def _lost(self, now: float) -> None:
        if self.exploring:
            self.explore_every_s = min(EXPLORE_MAX_S, 2 * self.explore_every_s)
            self.next_explore_s = now + self.explore_every_s
        else:
            self.last_probe_s = now
            self.cooldown_s = min(EXPLORE_MAX_S, 2 * self.cooldown_s)
            # nor an exploration soon after: both would be slow steps
            self.next_explore_s = max(self.next_explore_s, now + self.explore_every_s)


class OtherCpu:
    """How many cores processes other than this one kept busy lately: the machine's busy time
    (``/proc/stat``: user, nice, system, irq, softirq and steal, which is another virtual
    machine's) less this process's own (``/proc/self/stat``), over the last ``interval_s`` or
    more. Linux only: elsewhere ``cores()`` is always None."""

    def __init__(self, interval_s: float = OTHERS_SAMPLE_S, clock: Callable[[], float] = time.monotonic, root: Path = Path("/proc")) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.root = root
        self.tick_s = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
        self._last = self._read()
        self._cores: float | None = None

    def _read(self) -> tuple[float, int, int] | None:
        try:
            fields = (self.root / "stat").read_text().split("\n", 1)[0].split()
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
            own = (self.root / "self" / "stat").read_text().rsplit(")", 1)[1].split()
            return self.clock(), user + nice + system + irq + softirq + steal, int(own[11]) + int(own[12])
        except (OSError, ValueError, IndexError):
            return None

    def cores(self) -> float | None:
        """Cores used by other processes, averaged since the last sample (None: unknown)."""
        if self._last is None or self.clock() - self._last[0] < self.interval_s:
            return self._cores
        now = self._read()
        if now is None:
            self._last = None
            return None
        (t0, busy0, own0), (t1, busy1, own1) = self._last, now
        self._last = now
        if t1 - t0 > 3 * self.interval_s:
            # the worker was idle (nothing asked): an average over that gap is not "lately"
            # (a benchmark's bare loop, run while the server waited, would count)
            self._cores = None
        else:
            self._cores = max(0.0, ((busy1 - busy0) - (own1 - own0)) * self.tick_s / (t1 - t0))
        return self._cores
