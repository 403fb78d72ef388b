"""Per-lane token sampling in NumPy, for engines that hand back logits (MLX).

Mirrors the llama.cpp engine's sampler chain (``LlamaCppEngine._build_sampler``) so a request
means the same on either engine: penalties over the last 64 accepted tokens (repeat, frequency,
presence), then greedy at temperature 0, else top-k, top-p, min-p, temperature and a seeded
draw. The random streams differ from llama.cpp's, so seeded samples repeat on one engine, not
across engines.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable

import numpy as np

from scheduler.core.types import SamplingParams

PENALTY_LAST_N = 64  # as the llama.cpp engine's _PENALTY_LAST_N


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


class LaneSampler:
    """One lane's sampler state: its parameters, recent tokens and random stream."""

    def __init__(self, params: SamplingParams, history: Iterable[int] = ()) -> None:
        self.params = params
        self.recent: collections.deque[int] = collections.deque(maxlen=PENALTY_LAST_N)
        self.penalised = (
            params.repeat_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
        )
        # seed None: a fresh random stream, as LLAMA_DEFAULT_SEED asks llama.cpp for
        self.rng = np.random.default_rng(None if params.seed is None else params.seed & 0xFFFFFFFF)
        for token in history:
            self.accept(token)

    def accept(self, token: int) -> None:
        self.recent.append(int(token))

    def penalise(self, logits: np.ndarray) -> np.ndarray:
        """A float32 copy of ``logits`` with llama.cpp's penalties applied to recent tokens: a
        positive logit divided by the repeat penalty, another multiplied by it, then lowered by
        count x frequency penalty + presence penalty."""
        sp = self.params
        logits = np.array(logits, dtype=np.float32)
        if self.penalised and self.recent:
            ids, counts = np.unique(np.fromiter(self.recent, dtype=np.int64), return_counts=True)
            inside = ids < logits.shape[0]
            ids, counts = ids[inside], counts[inside]
            vals = logits[ids]
            vals = np.where(vals <= 0, vals * sp.repeat_penalty, vals / sp.repeat_penalty)
            vals -= counts * sp.frequency_penalty + sp.presence_penalty
            logits[ids] = vals
        return logits

    def sample(self, logits: np.ndarray) -> int:
        """Pick the next token from one position's logits (any float dtype) and accept it."""
        sp = self.params
        logits = self.penalise(logits)
        if sp.temperature <= 0.0:
            token = int(np.argmax(logits))
        else:
            token = self._draw(logits)
        self.accept(token)
        return token

    def _draw(self, logits: np.ndarray) -> int:
        sp = self.params
        cand = np.arange(logits.shape[0])
        vals = logits
        if 0 < sp.top_k < vals.shape[0]:
            keep = np.argpartition(-vals, sp.top_k - 1)[: sp.top_k]
            cand, vals = cand[keep], vals[keep]
        if sp.top_p < 1.0:
            order = np.argsort(-vals, kind="stable")
            cand, vals = cand[order], vals[order]
            cum = np.cumsum(_softmax(vals))
            n = min(int(np.searchsorted(cum, sp.top_p)) + 1, vals.shape[0])  # the token crossing p stays
            cand, vals = cand[:n], vals[:n]
        if sp.min_p > 0.0:
            keep = vals >= vals.max() + math.log(sp.min_p)
            cand, vals = cand[keep], vals[keep]
        probs = _softmax(vals.astype(np.float64) / sp.temperature)
        return int(cand[self.rng.choice(probs.shape[0], p=probs)])
