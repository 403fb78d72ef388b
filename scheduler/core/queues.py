"""Per-class queues with lane caps, priority inside a class, and starvation aging.

Order inside a class: higher ``priority`` first, equal priority in arrival order. A preempted
job goes back to the *head* of its class. Across classes the scheduler picks the head with the
best *effective* class: a job that has waited ``starvation_ticks`` ticks rises one class per
period waited (never above interactive).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from .qos import QosClass
from .types import Job

_head_seq = itertools.count(-1, -1)  # requeued jobs sort before every arrival


def _order_key(job: Job) -> tuple[int, int, int]:
    if job.seq < 0:  # requeued by push_head: ahead of every arrival, whatever its priority
        return (0, 0, job.seq)
    return (1, -job.priority, job.seq)


class ClassQueues:
    def __init__(self, starvation_ticks: int) -> None:
        self.starvation_ticks = starvation_ticks
        self._queues: dict[QosClass, list[Job]] = {c: [] for c in QosClass}

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __iter__(self) -> Iterator[Job]:
        for c in QosClass:
            yield from self._queues[c]

    def depth(self, qos: QosClass) -> int:
        return len(self._queues[qos])

    def push(self, job: Job) -> None:
        queue = self._queues[job.qos]
        queue.append(job)
        queue.sort(key=_order_key)

    def push_head(self, job: Job) -> None:
        """Requeue a preempted job ahead of everything in its class."""
        job.seq = next(_head_seq)
        queue = self._queues[job.qos]
        queue.insert(0, job)
        queue.sort(key=_order_key)

    def remove(self, job: Job) -> bool:
        queue = self._queues[job.qos]
        if job in queue:
            queue.remove(job)
            return True
        return False

    def effective_class(self, job: Job, tick: int) -> int:
        if self.starvation_ticks <= 0:
            return int(job.qos)
        periods = (tick - job.enqueued_tick) // self.starvation_ticks
        return max(int(QosClass.INTERACTIVE), int(job.qos) - max(0, periods))

    def best(self, tick: int, allowed: set[QosClass]) -> Job | None:
        """The head of the best (effective) class among classes in ``allowed``."""
        heads = [self._queues[c][0] for c in allowed if self._queues[c]]
        if not heads:
            return None
        return min(heads, key=lambda j: (self.effective_class(j, tick), -j.priority, j.seq))

    def pop(self, job: Job) -> Job:
        self._queues[job.qos].remove(job)
        return job
