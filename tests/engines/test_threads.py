"""The thread governor: how many compute threads llama.cpp's next step uses, by measurement."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.engines.sim import FakeClock
from scheduler.engines.threads import EXPLORE_MAX_S, OtherCpu, ThreadGovernor, candidates, step_kind

# steps of a busy server: decode rounds of 8 lanes, now and then a 512-token prompt step
STEPS = [(False, 8)] * 6 + [(True, 512)]


def run(gov: ThreadGovernor, clock: FakeClock, cost: Callable[[int, float], float], n: int) -> Counter[int]:
    """``n`` steps; ``cost(threads, now)`` is the seconds per token. The threads used, counted."""
    used: Counter[int] = Counter()
    for i in range(n):
        prefill, tokens = STEPS[i % len(STEPS)]
        kind = step_kind(prefill, tokens)
        threads = gov.threads_for(kind)
        seconds = cost(threads, clock.now) * tokens * (1.0 if prefill else 4.0)  # a decode token costs more
        clock.advance(seconds)
        gov.observe(threads, kind, seconds, tokens)
        used[threads] += 1
    return used


def quiet(threads: int, _now: float) -> float:
    return 0.004 / min(threads, 2) ** 0.85  # two threads ~1.8x one


def one_step(gov: ThreadGovernor, clock: FakeClock, kind: str, tokens: int, seconds: Callable[[int], float]) -> int:
    """One step of ``kind`` with the count the governor picks, taking ``seconds(threads)``;
    returns that count."""
    threads = gov.threads_for(kind)
    took = seconds(threads)
    clock.advance(took)
    gov.observe(threads, kind, took, tokens)
    return threads


def chat_beside_agents(kind: str) -> Callable[[int], float]:
    """Seconds for a step of ``kind`` where one thread decodes a lane 20% faster than two and
    runs a 512-token prompt step at half the speed."""
    if kind.startswith("prefill/"):
        return lambda threads: 512 * 0.004 * (1.0 if threads == 2 else 2.0)
    return lambda threads: 0.015 * (1.0 if threads == 2 else 0.8)


def test_on_a_quiet_machine_every_core_is_used_and_fewer_are_tried_rarely() -> None:
    clock = FakeClock()
    gov = ThreadGovernor(2, clock=clock)
    used = run(gov, clock, quiet, 5000)
    assert gov.current == 2 and gov.switches == 0
    assert used[1] <= 12  # a few decode rounds exploring, with the back-off: 5000 steps ~ 10 minutes here
    assert clock.now - 1000 > 500


def test_when_the_cores_are_taken_it_drops_to_one_thread_and_comes_back_when_they_are_free() -> None:
    clock = FakeClock()
    gov = ThreadGovernor(2, clock=clock)
    busy = (1300.0, 1700.0)

    def cost(threads: int, now: float) -> float:
        if busy[0] <= now < busy[1]:
            return 0.004 * (25.0 if threads == 2 else 1.6)  # barriers wait for descheduled threads
        return quiet(threads, now)

    while clock.now < busy[0]:  # 20 minutes of quiet: the explorations have backed off to 4
        run(gov, clock, cost, 1)
    assert gov.explore_every_s == EXPLORE_MAX_S
    while clock.now < busy[0] + 10:  # a decode round takes 3.2 s on two threads now
        run(gov, clock, cost, 1)
    assert gov.current == 1  # within a few rounds of the cores being taken
    while clock.now < busy[1]:
        run(gov, clock, cost, 1)
    while clock.now < busy[1] + EXPLORE_MAX_S + 30:
        run(gov, clock, cost, 1)
    assert gov.current == 2


def test_one_core_means_one_thread_and_no_probe() -> None:
    clock = FakeClock()
    gov = ThreadGovernor(1, clock=clock)
    used = run(gov, clock, lambda t, now: 0.01, 500)
    assert used == Counter({1: 500}) and gov.probe is None
    assert candidates(1) == [1] and candidates(2) == [2, 1] and candidates(16) == [16, 15, 1]


@settings(max_examples=60, deadline=None)
@given(
    max_threads=st.sampled_from([2, 4, 16]),
    winner=st.integers(0, 2),
    edge=st.floats(1.5, 30.0),
)
def test_with_steady_costs_it_settles_on_the_count_that_is_clearly_fastest(max_threads: int, winner: int, edge: float) -> None:
    counts = candidates(max_threads)
    fastest = counts[min(winner, len(counts) - 1)]
    clock = FakeClock()
    gov = ThreadGovernor(max_threads, clock=clock)

    def cost(threads: int, _now: float) -> float:
        return 0.002 * (1.0 if threads == fastest else edge)

    run(gov, clock, cost, 400)
    for _ in range(200):  # enough explorations to have met the fastest count
        if gov.current == fastest:
            break
        run(gov, clock, cost, 50)
    assert gov.current == fastest
    used = run(gov, clock, cost, 2000)
    assert used[fastest] >= 0.97 * 2000


def test_steps_that_vary_without_busy_cores_cost_few_probes() -> None:
    """Prompt steps deep in a long context cost more per token than early ones, and a burst of
    the web process slows a step now and then: neither is busy cores, and the probes they
    set off (each a slower step) back off instead of recurring every few seconds."""
    clock = FakeClock()
    gov = ThreadGovernor(2, clock=clock)
    n = 0

    def cost(threads: int, _now: float) -> float:
        nonlocal n
        n += 1
        jitter = 2.5 if n % 50 == 0 else 1.0 + (n % 7) / 10  # a burst every 50th step
        return quiet(threads, 0) * jitter

    used = run(gov, clock, cost, 20_000)
    assert gov.current == 2
    assert used[1] <= 40  # against 20,000 steps (about half an hour here)


def test_a_passing_slow_step_does_not_switch_the_count() -> None:
    """A single step slowed by something passing (the web process, a page fault) sets off a
    probe with fewer threads, whose step looks cheap beside it; the next step with all threads
    is fast again, so the count stays."""
    clock = FakeClock()
    gov = ThreadGovernor(2, clock=clock)
    run(gov, clock, quiet, 700)
    kind = step_kind(True, 512)
    for _ in range(40):
        clock.advance(60)
        gov.observe(2, kind, quiet(2, 0) * 512 * 6, 512)  # one step six times slower
        if gov.probe is None:
            continue
        assert gov.threads_for(kind) == 1
        gov.observe(1, kind, quiet(1, 0) * 512, 512)  # the probe: a normal one-thread step
        assert gov.threads_for(kind) == 2  # still all threads for the confirming step
        gov.observe(2, kind, quiet(2, 0) * 512, 512)  # back to normal
    assert gov.current == 2 and gov.switches == 0


def test_a_kind_of_step_that_runs_clearly_slower_with_a_new_count_keeps_the_old_one() -> None:
    """Seen in agents-and-chat runs on two cores: the chat's one-lane decode rounds ran faster
    with one thread, the count went to one for every step, and the agents' 512-token prompt
    steps ran on one thread for 100 s. Here one thread decodes a lane 20% faster and prefills at
    half the speed: the decode rounds go to one thread, the prompt steps stay on two (one step
    on one thread tells)."""
    clock = FakeClock()
    gov = ThreadGovernor(2, clock=clock)
    steps = [(False, 1)] * 8 + [(True, 512)]  # the chat's rounds between the agents' prompt steps
    used: dict[bool, Counter[int]] = {False: Counter(), True: Counter()}
    for i in range(6000):
        prefill, tokens = steps[i % len(steps)]
        kind = step_kind(prefill, tokens)
        used[prefill][one_step(gov, clock, kind, tokens, chat_beside_agents(kind))] += 1
    assert gov.switches >= 1 and gov.threads_for(step_kind(False, 1)) == 1
    assert gov.threads_for(step_kind(True, 512)) == 2
    assert used[True][2] >= 0.99 * sum(used[True].values())
    assert used[False][1] >= 0.9 * sum(used[False].values())


def test_a_kind_that_kept_its_count_follows_the_others_once_it_turns_slow_with_it() -> None:
    """Busy cores begin right after a prompt step: the decode rounds turn slow and go to one
    thread, and the first one-thread prompt step looks slow beside the prompt steps' cost
    measured on quiet cores just before, so prompt steps keep two threads. The next two-thread
    prompt step, slowed by the busy cores, is slow against its best, and prompt steps go to one
    thread as well."""
    clock = FakeClock()
    gov = ThreadGovernor(2, clock=clock)
    decode, prefill = step_kind(False, 8), step_kind(True, 512)
    busy = False

    def step(kind: str) -> int:
        tokens = 512 if kind == prefill else 8

        def seconds(threads: int) -> float:
            busy_cost = 0.004 * (1.6 if threads == 1 else (3.0 if kind == prefill else 25.0))
            return (busy_cost if busy else 0.004 / threads**0.85) * tokens

        return one_step(gov, clock, kind, tokens, seconds)

    for _ in range(4):  # 10 s of quiet serving, no exploration yet
        for _ in range(6):
            assert step(decode) == 2
        assert step(prefill) == 2
    busy = True
    decode_threads = [step(decode) for _ in range(6)]
    assert decode_threads[-1] == 1 and gov.current == 1  # the rounds turned slow and switched
    assert [step(prefill) for _ in range(4)] == [1, 2, 1, 1]  # kept two, turned slow, follows


def test_a_kind_not_measured_just_before_a_switch_runs_once_with_the_old_count_to_compare() -> None:
    """The last agent's one-lane decode rounds switch the count to one; the next agents come
    minutes later. Their first prompt step runs with two threads, beside which the second, with
    one, is clearly slower: prompt steps keep two threads."""
    clock = FakeClock()
    gov = ThreadGovernor(2, clock=clock)
    decode, prefill = step_kind(False, 1), step_kind(True, 512)

    def step(kind: str) -> int:
        return one_step(gov, clock, kind, 512 if kind == prefill else 1, chat_beside_agents(kind))

    step(prefill)
    for _ in range(10_000):
        if gov.current == 1:
            break
        step(decode)
    assert gov.current == 1
    clock.advance(300)
    assert [step(prefill) for _ in range(4)] == [2, 1, 2, 2]
    assert step(decode) == 1


def test_a_try_on_a_kind_of_step_that_does_not_come_again_does_not_block_the_next() -> None:
    """An exploring try is set on the chat's one-lane decode round, and the chat ends: no
    one-lane round comes again. While a try waits nothing else is tried, so with busy cores
    (one thread 15x faster) the agents' 8-lane rounds would stay on two threads; the try is
    dropped after a while and the rounds find one thread."""
    clock = FakeClock()
    gov = ThreadGovernor(2, clock=clock)
    one_lane, eight_lanes = step_kind(False, 1), step_kind(False, 8)

    def step(kind: str) -> int:
        return one_step(gov, clock, kind, 1, lambda threads: 0.05 * (15.0 if threads == 2 else 1.0))  # busy cores from the start

    while clock.now + 1.0 < gov.next_explore_s:
        step(eight_lanes)
    clock.advance(gov.next_explore_s - clock.now)
    step(one_lane)  # the chat's last round, once exploring is due: the try lands on it
    assert gov.probe is not None and gov.probe[1] == one_lane
    for _ in range(200):  # ~150 s of 8-lane rounds
        step(eight_lanes)
    assert gov.current == 1


def test_cores_kept_busy_from_before_the_first_step_are_answered_with_fewer_threads() -> None:
    """A busy loop runs before the server's first step: every step is as slow as the fastest
    seen, so none is slow, and exploring runs only on decode rounds (none come while eight
    agents' prompts are prefilled). Other processes' CPU, read from /proc, counts as busy cores:
    the next prompt step tries one thread, and keeps it."""
    clock = FakeClock()
    gov = ThreadGovernor(2, clock=clock)
    prefill = step_kind(True, 512)

    gov.others_busy = True

    def step() -> int:
        return one_step(gov, clock, prefill, 512, lambda threads: 512 * 0.004 * (1.0 if threads == 1 else 2.5))  # two threads wait on the busy core

    assert [step() for _ in range(5)] == [2, 1, 2, 1, 1]  # a try, its confirming step, then one


def test_beside_other_processes_a_count_of_fewer_threads_that_is_faster_at_all_takes_over() -> None:
    """A busy loop on one of two cores (the AVX-512 EPYC, session 50): one thread ran the eight
    agents' prompt steps only ~13% faster than two, under the 15% a try must win by on a quiet
    machine, so every try lost and the server kept two threads through whole runs (79 s against
    68 s). With other processes' CPU counted as busy, fewer threads need only be faster; with the
    cores quiet again, the margin is the usual one."""
    clock = FakeClock()
    gov = ThreadGovernor(2, clock=clock)
    prefill = step_kind(True, 512)

    def step() -> int:
        return one_step(gov, clock, prefill, 512, lambda threads: 512 * 0.004 * (0.87 if threads == 1 else 1.0))

    gov.others_busy = True
    assert [step() for _ in range(5)] == [2, 1, 2, 1, 1]  # a try, its confirming step, then one
    assert gov.current == 1 and gov.switches == 1

    # the same 13% once the other processes are gone is not enough: the try loses, two stay
    again = ThreadGovernor(2, clock=clock)
    again.others_busy = True

    def step_again() -> int:
        return one_step(again, clock, prefill, 512, lambda threads: 512 * 0.004 * (0.87 if threads == 1 else 1.0))

    assert step_again() == 2  # busy: the next step tries one thread
    again.others_busy = False
    assert [step_again() for _ in range(4)] == [1, 2, 2, 2]
    assert again.current == 2 and again.switches == 0


def test_other_processes_cpu_is_the_machines_busy_time_less_this_processs(tmp_path: Path) -> None:
    clock = FakeClock()
    (tmp_path / "self").mkdir()

    def write(busy: tuple[int, int, int, int], idle: int, own: tuple[int, int]) -> None:
        user, system, irq, steal = busy
        (tmp_path / "stat").write_text(f"cpu  {user} 0 {system} {idle} 0 {irq} 0 {steal} 0 0\ncpu0 1 2 3 4\n")
        (tmp_path / "self" / "stat").write_text("42 (python (worker)) S " + " ".join(["0"] * 10) + f" {own[0]} {own[1]} 0 0\n")

    write((1000, 100, 0, 0), 5000, (300, 20))
    others = OtherCpu(interval_s=1.0, clock=clock, root=tmp_path)
    tick = others.tick_s
    assert others.cores() is None  # no interval measured yet
    clock.advance(2.0)
    # two seconds (n ticks of one core): the machine 1.9 cores busy (0.2 of it stolen by another
    # virtual machine), this process 1.0 of them
    n = round(2.0 / tick)
    write((1000 + int(1.5 * n), 100 + int(0.2 * n), 0, int(0.2 * n)), 5000 + n, (300 + int(0.9 * n), 20 + int(0.1 * n)))
    assert abs((others.cores() or 0) - 0.9) < 0.02
    clock.advance(0.5)
    assert abs((others.cores() or 0) - 0.9) < 0.02  # within the interval: the last figure
    clock.advance(60.0)  # the worker idle a minute, another process busy meanwhile
    write((1000 + int(1.5 * n) + 60 * n, 100 + int(0.2 * n), 0, int(0.2 * n)), 5000 + n, (300 + int(0.9 * n), 20 + int(0.1 * n)))
    assert others.cores() is None  # not "lately": the next sample says
    clock.advance(1.0)
    assert others.cores() == 0.0
    (tmp_path / "stat").unlink()
    clock.advance(2.0)
    assert others.cores() is None  # not Linux, or /proc unreadable: unknown, never busy
