"""Per-lane token sampling in NumPy, for engines that hand back logits (MLX).

Mirrors the llama.cpp engine's sampler chain (``LlamaCppEngine._build_sampler``) so a request
means the same on either engine: logit bias (and ``ignore_eos``: end-of-generation tokens
banned), penalties over the last 64 accepted tokens (repeat, frequency, presence), the grammar
(a token mask, :mod:`scheduler.engines.token_mask`), then greedy at temperature 0, else top-k,
typical-p, top-p, min-p, temperature and a seeded draw. Logprobs are the raw logits' (before
any of that), as the llama.cpp engine reports them. The random streams differ from llama.cpp's,
so seeded samples repeat on one engine, not across engines.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Collection, Iterable
from typing import Protocol

import numpy as np

from scheduler.core.types import SamplingParams, seed32

PENALTY_LAST_N = 64  # as the llama.cpp engine's _PENALTY_LAST_N
# A bias of -100 and ignore_eos ban a token, as the llama.cpp engine does: finitely, so that when
# the grammar allows only banned tokens the draw still lands on one it allows.
BAN = -1.0e9
_F32_MAX = float(np.finfo(np.float32).max)
# The smallest repeat penalty either engine applies, divided by a temperature below 1: a repeated
# token's positive logit divided by it (and then by the temperature) stays finite in float32 up
# to a logit of 1e4, where a tinier one made it +inf (llama.cpp's softmax NaN: garbage tokens)
# or tied every repeated token at float32's max (the NumPy clamp). Either way a repeated token
# with a positive logit wins, the best of them first.
MIN_REPEAT_PENALTY = 1e-34


def repeat_penalty_of(sp: SamplingParams) -> float:
    """The repeat penalty both engines apply for ``sp`` (:data:`MIN_REPEAT_PENALTY`); greedy
    below a temperature of 1e-30, as the llama.cpp engine's ``_MIN_TEMPERATURE``. At most
    float32's largest (the schema bounds it only below): llama.cpp takes it as a C float, and
    a larger one was +inf there, which made a repeated logit of exactly 0 NaN (0 x inf)."""
    scale = 1.0 if sp.temperature < 1e-30 else min(sp.temperature, 1.0)
    return min(max(sp.repeat_penalty, MIN_REPEAT_PENALTY / scale), _F32_MAX)


class TokenConstraint(Protocol):
    """A lane's grammar state (:class:`scheduler.engines.token_mask.GrammarMatcher`)."""

    def allowed(self) -> np.ndarray: ...

    def accept(self, token: int) -> None: ...


def _softmax(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # a spread past float64's range: exp(-inf) = 0, as meant
        e = np.exp(x - x.max())
    return e / e.sum()


class LaneSampler:
    """One lane's sampler state: its parameters, recent tokens and random stream."""

    def __init__(
        self,
        params: SamplingParams,
        history: Iterable[int] = (),
        *,
        grammar: TokenConstraint | None = None,
        eog: Collection[int] = (),
        draws: int | None = None,
    ) -> None:
        self.params = params
        self.grammar = grammar
        self.eog = sorted(eog)  # what ignore_eos bans, and the way out of a grammar with no token left
        self.biases = {int(t): (BAN if b <= -100.0 else float(b)) for t, b in params.logit_bias}
        if params.ignore_eos:
            self.biases.update({t: BAN for t in self.eog})
        # the last sample's (logprob, top alternatives) when the params ask for logprobs
        self.last_logprobs: tuple[float, list[tuple[int, float]]] | None = None
        self.recent: collections.deque[int] = collections.deque(maxlen=PENALTY_LAST_N)
        self.penalised = (
            params.repeat_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
        )
        # no seed (or llama-server's -1, "random"): a fresh random stream, as llama.cpp draws one
        seed = seed32(params.seed)
        self.rng = np.random.default_rng(seed)
        # replaying what the lane generated before (a parked lane bound again) rebuilds the
        # penalties' window and the grammar's state
        replayed = 0
        for token in history:
            self.accept(token)
            replayed += 1
        # and the random stream goes on past the draws made before (``draws``, a parked
        # sampler's count; else one per token), not from the seed
        self.draws = replayed if draws is None else draws
        if self.draws and params.temperature > 0.0 and seed is not None:
            self.rng.random(self.draws)  # Generator.choice(p=...) takes one double per draw

    def accept(self, token: int) -> None:
        self.recent.append(int(token))
        if self.grammar is not None:
            self.grammar.accept(int(token))

    def penalise(self, logits: np.ndarray) -> np.ndarray:
        """A float32 copy of ``logits`` with llama.cpp's penalties applied to recent tokens: a
        positive logit divided by the repeat penalty, another multiplied by it, then lowered by
        count x frequency penalty + presence penalty."""
        sp = self.params
        logits = np.array(logits, dtype=np.float32)
        repeat_penalty = repeat_penalty_of(sp)
        if self.penalised and self.recent:
            ids, counts = np.unique(np.fromiter(self.recent, dtype=np.int64), return_counts=True)
            inside = ids < logits.shape[0]
            ids, counts = ids[inside], counts[inside]
            vals = logits[ids].astype(np.float64)
            with np.errstate(over="ignore"):
                vals = np.where(vals <= 0, vals * repeat_penalty, vals / repeat_penalty)
            vals -= counts * sp.frequency_penalty + sp.presence_penalty
            # repeat_penalty has no upper bound: a finite logit stays finite (clamped to float32's
            # range), as +inf would drop the token the penalty favours from the draw and -inf
            # everywhere would leave nothing to draw from
            logits[ids] = np.where(np.isfinite(logits[ids]), np.clip(vals, -_F32_MAX, _F32_MAX), vals)
        return logits

    def sample(self, logits: np.ndarray) -> int:
        """Pick the next token from one position's logits (any float dtype) and accept it."""
        sp = self.params
        raw = logits
        logits = np.array(logits, dtype=np.float32)
        n = logits.shape[0]
        for t, b in self.biases.items():
            if 0 <= t < n:
                logits[t] += b
        logits = self.penalise(logits)
        if self.penalised:
            # a penalty can lift a banned token in its window (a repeat penalty below 1 shrinks
            # the ban's negative logit towards 0, a negative one adds to it): ban it again after,
            # as the llama.cpp engine's chain does
            for t, b in self.biases.items():
                if b == BAN and 0 <= t < n:
                    logits[t] += BAN
        if self.grammar is not None:
            allowed = self.grammar.allowed()[:n]
            if allowed.shape[0] < n:
                allowed = np.concatenate([allowed, np.zeros(n - allowed.shape[0], dtype=bool)])
            if not allowed.any():
                # the grammar failed or holds nothing more: end the reply rather than break it
                allowed[[t for t in self.eog if t < n] or [int(np.argmax(logits))]] = True
            logits = np.where(allowed, logits, -np.inf).astype(np.float32)
        if sp.temperature <= 0.0:
            token = int(np.argmax(logits))
        else:
            token = self._draw(logits)
        if sp.logprobs is not None:
            self.last_logprobs = logprobs_of(raw, token, sp.logprobs)
        self.accept(token)
        return token

    def _draw(self, logits: np.ndarray) -> int:
        sp = self.params
        cand = np.flatnonzero(np.isfinite(logits))  # what the grammar left
        vals = logits[cand]
        if 0 < sp.top_k < vals.shape[0]:
            keep = np.argpartition(-vals, sp.top_k - 1)[: sp.top_k]
            cand, vals = cand[keep], vals[keep]
        if sp.typical_p < 1.0:
            cand, vals = _typical(cand, vals, sp.typical_p)
        if sp.top_p < 1.0:
            order = np.argsort(-vals, kind="stable")
            cand, vals = cand[order], vals[order]
            cum = np.cumsum(_softmax(vals))
            n = min(int(np.searchsorted(cum, sp.top_p)) + 1, vals.shape[0])  # the token crossing p stays
            cand, vals = cand[:n], vals[:n]
        if sp.min_p > 0.0:
            keep = vals >= vals.max() + math.log(sp.min_p)
            cand, vals = cand[keep], vals[keep]
        with np.errstate(over="ignore"):
            scaled = vals.astype(np.float64) / sp.temperature
        if not np.isfinite(scaled).all():  # a temperature so small the logits overflow: greedy
            return int(cand[int(np.argmax(vals))])
        probs = _softmax(scaled)
        self.draws += 1
        return int(cand[self.rng.choice(probs.shape[0], p=probs)])


def _typical(cand: np.ndarray, vals: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """Locally typical sampling as llama.cpp's ``llama_sampler_init_typical(p, 1)``: keep the
    tokens whose surprise is closest to the distribution's entropy, until their probability
    passes ``p``."""
    probs = _softmax(vals.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(probs)
        entropy = -np.nansum(probs * logp)
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    cum = np.cumsum(probs[order])
    n = min(int(np.searchsorted(cum, p, side="right")) + 1, vals.shape[0])  # the token crossing p stays
    keep = order[:n]
    return cand[keep], vals[keep]


def logprobs_of(logits: np.ndarray, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of ``token`` under the raw ``logits`` and the ``top`` likeliest tokens
    with theirs; every engine reports logprobs through this (llama.cpp's and MLX's alike)."""
    row = np.asarray(logits, dtype=np.float64)
    shift = row.max()
    logz = shift + np.log(np.exp(row - shift).sum())
    alts: list[tuple[int, float]] = []
    top = min(top, row.shape[0])  # top_logprobs (up to 20) may pass a small vocabulary's size
    if top > 0:
        idx = np.argpartition(-row, top - 1)[:top]
        idx = idx[np.argsort(-row[idx], kind="stable")]
        alts = [(int(i), float(row[i] - logz)) for i in idx]
    return float(row[token] - logz), alts
