"""Per-class queues with lane caps, scored order inside a class, and starvation aging.

Inside a class a job's *score* is ``priority + swap affinity + waited_s / aging_divisor``
(request-priority seed): higher scores go first, equal scores in arrival order. Aging is
unbounded, so low-priority work cannot starve; with equal priorities the older job always has
the higher score, which is plain FIFO. A preempted job goes back to the *head* of its class,
ahead of every score. Across classes the scheduler picks the job with the best *effective*
class: a job that has waited ``starvation_ticks`` ticks rises one class per period waited
(never above interactive), its wait counted from its receipt, the time it held a lane left out
(a preemption does not start it again); among the jobs of the class it rose into, its priority
counts from that class's anchor as it counted from its own (``lift``). A tick here is the seed's busy tick,
``--tick-target-ms`` (2 s by default) of waiting: aging only matters while every lane is busy,
and llama.cpp and MLX cut their busy ticks shorter (a decode round costs the same however
rounds are cut), which must not make classes age faster. The effective class only orders
admission into free lanes: it never makes a job preempt (the scheduler preempts by a job's own
class), though a job it admitted ahead of better classes is not preempted by those while its
standing still wins (``order``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .qos import CLASS_ANCHOR, QOS_CLASSES, QosClass
from .types import Job

_head_seq = itertools.count(-1, -1)  # requeued jobs get negative seqs: ahead of every arrival


@dataclass(frozen=True)
class ScoreConfig:
    aging_divisor_s: float = 60.0  # seconds of waiting per priority point; 0 disables aging
    swap_affinity_bonus: int = 10  # for a job whose model is loaded (0..99)


class ClassQueues:
    def __init__(self, starvation_ticks: int, score: ScoreConfig | None = None, tick_s: float = 2.0) -> None:
        self.starvation_ticks = starvation_ticks
        self.tick_s = tick_s  # the length of one aging tick (--tick-target-ms)
        self.score_config = score or ScoreConfig()
        self._queues: dict[QosClass, list[Job]] = {c: [] for c in QOS_CLASSES}  # best class first: __iter__'s order
        self.reorders = {"aging": 0, "swap_affinity": 0}

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __bool__(self) -> bool:
        return any(self._queues.values())

    def __iter__(self) -> Iterator[Job]:
        for queue in self._queues.values():
            yield from queue

    def depth(self, qos: QosClass) -> int:
        return len(self._queues[qos])

    def push(self, job: Job) -> None:
        self._queues[job.qos].append(job)

    def push_head(self, job: Job) -> None:
        """Requeue a preempted job ahead of everything in its class (latest preempted first)."""
        job.seq = next(_head_seq)
        self._queues[job.qos].append(job)

    def remove(self, job: Job) -> bool:
        queue = self._queues[job.qos]
        if job in queue:
            queue.remove(job)
            return True
        return False

    def pop(self, job: Job) -> Job:
        self._queues[job.qos].remove(job)
        return job

    # -- order -------------------------------------------------------------------------

    def affinity(self, job: Job) -> int:
        """Swap affinity: every job here is for the model this worker has loaded."""
        return self.score_config.swap_affinity_bonus

    def aging(self, job: Job, now: float) -> float:
        divisor = self.score_config.aging_divisor_s
        return max(0.0, now - job.arrival_s) / divisor if divisor > 0 else 0.0

    def score(self, job: Job, now: float) -> float:
        return job.priority + self.affinity(job) + self.aging(job, now)

    def aging_period_s(self) -> float:
        """Seconds of waiting that lift a job one class: ``starvation_ticks`` busy ticks."""
        return self.starvation_ticks * self.tick_s

    def waited(self, job: Job, now: float) -> float:
        """Seconds ``job`` has waited in this worker's queue: since it joined it, plus what it
        had waited before a preemption put it back."""
        return job.waited_s + max(0.0, now - job.enqueued_s)

    def effective_class(self, job: Job, now: float) -> int:
        period = self.aging_period_s()
        if period <= 0:
            return int(job.qos)
        periods = int(self.waited(job, now) // period)
        return max(int(QosClass.INTERACTIVE), int(job.qos) - periods)

    def lift(self, job: Job, cls: int) -> int:
        """What ``job``'s priority counts for among the jobs of class ``cls``, which class aging
        lifted it into: its offset from its own class's anchor, from that class's anchor. A
        request that sends no priority has its class's anchor (background -100, interactive
        100), so a lifted job otherwise lost every tie to the jobs born in the class it rose into
        (a background job went before a later interactive chat after ~200 minutes, not three
        aging periods). 0 for a job in its own class."""
        return CLASS_ANCHOR[QosClass(cls)] - CLASS_ANCHOR[job.qos]

    def _rank(self, job: Job, now: float, cls: int | None = None) -> tuple[int, float, int]:
        """The rank inside a class (lowest first): inside its own, or ``cls``, the class aging
        lifted it into. A preempted job heads its own class only: in a class it rose into it is
        ranked as any lifted job is (it once headed those too, before jobs of higher priority
        born there); its negative seq still wins a tie."""
        if job.seq < 0 and (cls is None or cls == job.qos):  # requeued after preemption: ahead of every arrival
            return (0, 0.0, job.seq)
        lift = 0 if cls is None else self.lift(job, cls)
        return (1, -(self.score(job, now) + lift), job.seq)

    def order(self, job: Job, now: float) -> tuple[int, int, float, int]:
        """Admission's order (lowest first): effective class, then the rank inside it."""
        cls = self.effective_class(job, now)
        return (cls, *self._rank(job, now, cls))

    def head(self, qos: QosClass, now: float, keep: Callable[[Job], bool] | None = None) -> Job | None:
        candidates = [j for j in self._queues[qos] if keep is None or keep(j)]
        if not candidates:
            return None
        return min(candidates, key=lambda j: self._rank(j, now))

    def best(
        self,
        allowed: set[QosClass],
        now: float = 0.0,
        keep: Callable[[Job], bool] | None = None,
    ) -> Job | None:
        """The job of the best effective class among classes in ``allowed``, in score order
        inside it; ``keep`` filters jobs out of consideration (e.g. those blocked by a waiting
        batch-invariant job). Every queued job ages, not only each queue's head: an old job
        behind a newer one of higher priority rises as its wait says (it once surfaced only
        when priority aging made it the head, after about 100 minutes for 100 points)."""
        jobs = [j for c in allowed for j in self._queues[c] if keep is None or keep(j)]
        if not jobs:
            return None
        return min(jobs, key=lambda j: self.order(j, now))

    def best_by_own_class(
        self, allowed: set[QosClass], now: float, keep: Callable[[Job], bool] | None = None
    ) -> Job | None:
        """The head of the best class in ``allowed`` by the jobs' own classes (aging ignored),
        in score order inside it: the order in which queued jobs may preempt."""
        for qos in sorted(allowed):
            head = self.head(qos, now, keep)
            if head is not None:
                return head
        return None

    def note_pick(
        self,
        picked: Job,
        allowed: set[QosClass],
        now: float,
        keep: Callable[[Job], bool] | None,
        *,
        by_own_class: bool = False,
    ) -> None:
        """Count a dispatch where aging changed the pick (the seed's reorder counter): into a
        free lane (``best``), or by preemption (``best_by_own_class``, so ``by_own_class``:
        the jobs it was chosen among are those of its own class)."""
        if picked.seq < 0 or picked.request_of or self.score_config.aging_divisor_s <= 0:
            return  # (a later choice of a request: not a dispatch of its own, as dispatched_<band> counts)

        def cls(job: Job) -> int:
            return int(job.qos) if by_own_class else self.effective_class(job, now)

        without_aging = [
            j
            for c in allowed
            for j in self._queues[c]
            if (keep is None or keep(j)) and j.seq >= 0 and cls(j) == cls(picked)
        ]
        if without_aging:
            static = min(without_aging, key=lambda j: (-(j.priority + self.affinity(j) + self.lift(j, cls(j))), j.seq))
            if static is not picked:
                self.reorders["aging"] += 1
