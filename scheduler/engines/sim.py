"""A cost-model engine for core tests and scale simulations: no model, deterministic tokens.

It keeps each lane's sequence exactly as a real engine's KV cache would, and checks the
contract on every feed (positions must continue the lane's sequence), so a scheduler bug that
would corrupt a real lane fails loudly here. The next token is a pure function of the lane's
sequence, so a preempted-and-resumed job must produce the same tokens as an undisturbed one.
Time is charged to an injected clock (prefill per token, decode per round).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scheduler.core.types import LaneBind, TickPlan, TickResult
from scheduler.engines.base import Step, run_tick

EOG_TOKEN = 2


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class SimParked:
    tokens: list[int]

    @property
    def nbytes(self) -> int:
        return 8 * len(self.tokens)


class SimEngine:
    name = "sim"

    def __init__(
        self,
        *,
        n_lanes: int = 8,
        lane_ctx: int = 4096,
        clock: FakeClock | None = None,
        prefill_s_per_token: float = 0.005,
        decode_round_s: float = 0.06,
        eog_after: dict[str, int] | None = None,
        cache_slots: int = 4,
        compact_lanes: bool = False,
    ) -> None:
        self.n_lanes = n_lanes
        self.compact_lanes = compact_lanes  # have the scheduler keep busy lanes in one run, as on llama.cpp
        self.lane_ctx = lane_ctx
        self.clock = clock or FakeClock()
        self.prefill_s_per_token = prefill_s_per_token
        self.decode_round_s = decode_round_s
        self.eog_after = eog_after or {}  # job_id -> emit EOG as its Nth generated token
        self.kv: list[list[int]] = [[] for _ in range(n_lanes + cache_slots)]  # lanes, then cache slots
        self.lane_job: list[str | None] = [None] * n_lanes
        self.generated: dict[str, int] = {}
        self.calls: list[list[tuple[int, int]]] = []  # per engine call: (lane, n tokens)
        self.on_call: Callable[[int], None] | None = None  # hook: runs after each call
        self.vocab_size = 256  # tokens are bytes
        self.features: frozenset[str] = frozenset()  # the basic sampler chain only
        self.chat_template: str | None = None
        self.n_ctx_train: int | None = None
        self.max_step_tokens = n_lanes * lane_ctx  # no batch limit of its own: plan.step_tokens decides

    # -- text ---------------------------------------------------------------------------

    def render_chat(self, messages: list[dict[str, Any]], **extra: Any) -> str:
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token: int) -> bytes:
        return bytes([token % 256])

    @staticmethod
    def next_token(sequence: list[int]) -> int:
        digest = hashlib.blake2b(bytes(t % 256 for t in sequence[-16:]), digest_size=2).digest()
        return 97 + digest[0] % 26  # a-z

    def fim_tokens(self) -> tuple[int, int, int] | None:
        return None

    def fim_repo_tokens(self) -> tuple[int | None, int | None]:
        return None, None

    def is_eog(self, token: int) -> bool:
        return token == EOG_TOKEN

    # -- ticks: run_tick over these primitives ---------------------------------------------

    @property
    def n_seqs(self) -> int:
        return len(self.kv)

    def execute(self, plan: TickPlan, should_stop: Callable[[], bool]) -> TickResult:
        return run_tick(self, plan, should_stop, self.clock)

    def save(self, seq: int) -> SimParked:
        return SimParked(list(self.kv[seq]))

    def load(self, seq: int, artifact: Any) -> None:
        assert seq >= self.n_lanes or not self.kv[seq], "restore into a lane that is not empty"
        self.kv[seq] = list(artifact.tokens)

    def clear(self, seq: int) -> None:
        self.kv[seq] = []

    def trim(self, seq: int, n_tokens: int) -> None:
        assert 0 < n_tokens <= len(self.kv[seq]), f"trim sequence {seq} holding {len(self.kv[seq])} to {n_tokens}"
        del self.kv[seq][n_tokens:]

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        assert dst >= self.n_lanes or not self.kv[dst], f"copy into lane {dst} that is not empty"
        assert len(self.kv[src]) >= n_tokens, f"copy of {n_tokens} tokens from sequence {src} holding {len(self.kv[src])}"
        self.kv[dst] = self.kv[src][:n_tokens]

    def bind_sampler(self, bind: LaneBind) -> None:
        self.lane_job[bind.lane] = bind.job_id
        self.generated[bind.job_id] = len(bind.history)

    def drop_sampler(self, lane: int) -> None:
        self.lane_job[lane] = None

    def swap_samplers(self, a: int, b: int) -> None:
        self.lane_job[a], self.lane_job[b] = self.lane_job[b], self.lane_job[a]

    def check_grammar(self, grammar: str) -> str | None:
        return "the sim engine has no grammar sampler"

    def take_logprobs(self) -> dict[int, tuple[float, list[tuple[int, float]]]]:
        return {}

    def take_failed(self) -> dict[int, str]:
        return {}

    def bound_lanes(self) -> set[int]:
        return {lane for lane, job in enumerate(self.lane_job) if job is not None}

    def forward(self, step: Step) -> dict[int, int]:
        """Extend each lane's sequence (checking that the feed continues it) and charge the
        clock a decode round plus the step's prompt tokens."""
        call: list[tuple[int, int]] = []
        sampled: dict[int, int] = {}
        for lane, start_pos, tokens, sample in step.pieces:
            lane_kv = self.kv[lane]
            assert len(lane_kv) == start_pos, f"lane {lane}: feed at {start_pos} but KV holds {len(lane_kv)}"
            lane_kv.extend(tokens)
            call.append((lane, len(tokens)))
            if sample:
                job_id = self.lane_job[lane]
                assert job_id is not None
                self.generated[job_id] = self.generated.get(job_id, 0) + 1
                sampled[lane] = EOG_TOKEN if self.eog_after.get(job_id) == self.generated[job_id] else self.next_token(lane_kv)
        n_prefill = sum(n for _, n in call) if step.prefill else 0
        self.clock.advance(self.decode_round_s + n_prefill * self.prefill_s_per_token)
        self.calls.append(call)
        if self.on_call is not None:
            self.on_call(len(self.calls))
        return sampled

    def close(self) -> None:
        pass
