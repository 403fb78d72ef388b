"""The MLX engine: an mlx-lm model with one KV cache per lane, behind the same protocol as
llama.cpp.

Built on mlx-lm's model classes and cache objects, with our own loop rather than its batch
generator: a lane is a list of per-layer ``KVCache`` objects (``make_prompt_cache``), so
parking, restoring and copying prefixes are plain array copies of one lane. Decode rounds are
batched: the decoding lanes' caches are merged into ``BatchKVCache`` objects (left-padded), which
stay merged while the same lanes keep decoding and are split back into per-lane caches when
anything else needs one of them. Left padding holds every lane of a batch at the longest one's
length, so lanes of far different lengths decode in separate batches of the same step
(``_decode_batches``): the memory held stays near the tokens the KV pool counts. Prompt chunks
run one lane at a time. On the CPU backend the batched round gives bit-identical logits to
running each lane alone with the BLAS bundled with mlx; through the system's OpenBLAS
(mlx_runtime) another batch shape rounds the last bits otherwise (~4e-5 on SmolLM2's logits);
the KV and positions stay each lane's own (tests/engines/test_mlx_differential.py).

Sampling is ``scheduler.engines.sampling`` (the llama.cpp engine's chain in NumPy, grammars as
llguidance token masks: ``scheduler.engines.token_mask``); text comes
from the model folder's ``tokenizer.json`` through the ``tokenizers`` library and its chat
template through the same Jinja rendering as llama.cpp (``scheduler.engines.chat``).

Models whose caches are not plain ``KVCache`` (sliding-window or recurrent layers) are refused.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scheduler.core.types import LaneBind
from scheduler.engines.base import EngineError, LaneEngine, Piece, Step, swap_keys
from scheduler.engines.chat import compile_chat_template, continued_tokens, prefixes_space, render_chat_template
from scheduler.engines.hf_vocab import HfVocabulary, read_json
from scheduler.engines.models import is_mlx_model_dir
from scheduler.engines.sampling import LaneSampler

if TYPE_CHECKING:
    from scheduler.engines.token_mask import TokenMasks

log = logging.getLogger("superfluid.engine")

# Special tokens that end a turn, as llama.cpp recognises them by text (llama-vocab.cpp: its
# end-of-generation list, and its EOT candidates: DeepSeek's, Kimi-K2's [EOT])
_EOG_TEXTS = frozenset(
    {
        "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
        "<|return|>", "<|call|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
        "</s>", "<｜end▁of▁sentence｜>", "[EOT]",
    }
)
def ends_of_generation(vocab: HfVocabulary, configured: set[int]) -> set[int]:
    """The tokens that end a generation: those the model's configuration names, and the added
    tokens llama.cpp ends one on by their text (_EOG_TEXTS), but for a control token the
    vocabulary writes as text (gpt-oss's <|end|>, hf_vocab.end_is_text: it ends a message, not
    the generation; llama.cpp drops it from its list)."""
    eog = configured | {i for i, t in vocab.added.items() if t.content in _EOG_TEXTS}
    return eog - {i for i, t in vocab.added.items() if t.content in vocab.rendered}


# A decoding lane joins a batch whose longest lane holds at most this many times its tokens,
# plus one step of mlx-lm's cache allocation (a lane's own KVCache grows by 256 positions too)
_PAD_FACTOR = 1.5
_PAD_SLACK = 256
# (prefix, suffix, middle) markers, as llama.cpp's vocabulary finds them by their text
_FIM_TEXTS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen, CodeGemma
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, Granite
    ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),  # CodeLlama
    ("<PRE>", "<SUF>", "<MID>"),
    ("<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"),  # GLM-4.5
    ("<|prefix|>", "<|suffix|>", "<|middle|>"),
)
# repo-level FIM's file separator and repository name (llama.cpp's FIM_SEP, FIM_REP), by text
# (StarCoder's "<file_sep>" is not one: llama.cpp leaves SmolLM2's, id 5, without that role)
_FIM_SEP_TEXTS = ("<|file_sep|>",)  # Qwen2.5-Coder
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")  # Qwen2.5-Coder; StarCoder's, as SmolLM2 has
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")  # llama-vocab.cpp's FIM pad texts (Qwen, Granite, Kimi-K2)


@dataclass(frozen=True)
class MlxParkedKV:
    """A lane's KV cache copied to host memory: per layer (keys, values), each
    ``(1, kv_heads, n_tokens, head_dim)``. bfloat16 caches are held as float32 (NumPy has no
    bfloat16) and cast back on restore, which is exact."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    n_tokens: int
    dtype: str
    draws: int | None = None  # the lane's sampler's draws so far (None: no sampler bound)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


class MlxEngine(LaneEngine):
    name = "mlx"

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_lanes: int = 8,
        lane_ctx: int = 4096,
        max_step_tokens: int = 512,
        cache_slots: int = 0,
        batch_decode: bool = True,
    ) -> None:
        self._set_lanes(n_lanes, lane_ctx, max_step_tokens, cache_slots)
        self.model_path = Path(model_path)
        if not is_mlx_model_dir(self.model_path):
            raise FileNotFoundError(
                f"not an MLX model folder (config.json and *.safetensors): {self.model_path}"
            )
        self.batch_decode = batch_decode

        from scheduler.engines.mlx_runtime import mlx_core

        mx = mlx_core()
        from mlx_lm.models.cache import KVCache, make_prompt_cache
        from mlx_lm.utils import load_model

        self._mx = mx
        self._kv_cache = KVCache
        self._make_cache = make_prompt_cache
        try:
            self._model, self._config = load_model(self.model_path)
        except Exception as exc:  # unknown model_type, weights that do not fit, unreadable files
            raise EngineError(f"mlx-lm could not load {self.model_path}: {exc}", permanent=True) from exc
        probe = make_prompt_cache(self._model)
        if not all(type(c) is KVCache for c in probe):
            kinds = sorted({type(c).__name__ for c in probe})
            raise EngineError(
                f"the MLX engine needs plain KV caches; {self.model_path.name} uses {', '.join(kinds)}",
                permanent=True,
            )
        self.n_layers = len(probe)
        # llama-server's /v1/models meta (the worker's hello carries it), as the llama.cpp engine's
        self.model_meta: dict[str, Any] = mlx_model_meta(self._model, self._config)
        n_seqs = n_lanes + cache_slots
        self._seqs: list[list[Any]] = [self._make_cache(self._model) for _ in range(n_seqs)]
        self._lens = [0] * n_seqs  # tokens in each sequence's cache
        # lanes whose caches are merged for decode rounds → their per-layer batch caches
        self._groups: dict[tuple[int, ...], list[Any]] = {}
        self._samplers: dict[int, LaneSampler] = {}
        self._step_logprobs: dict[int, tuple[float, list[tuple[int, float]]]] = {}  # the last forward's, until taken
        self._masks: TokenMasks | None = None  # llguidance's view of the vocabulary, built on first use
        self._setup_text()
        self._closed = False

    # -- text -------------------------------------------------------------------------

    def _setup_text(self) -> None:
        folder = self.model_path
        try:
            self._vocab = vocab = HfVocabulary(folder)
        except FileNotFoundError:
            raise EngineError(f"{folder} has no tokenizer.json (the MLX engine reads fast tokenizers only)", permanent=True) from None
        self._tok = vocab.tok
        tok_config = vocab.config
        self.vocab_size: int = vocab.vocab_size
        self.n_ctx_train: int = int(self._config.get("max_position_embeddings") or tok_config.get("model_max_length") or 0)
        self._pieces: dict[int, bytes] = {}
        self.bos_text, self.eos_text = vocab.bos_text, vocab.eos_text
        self.bos_id, self.eos_id = vocab.bos_id, vocab.eos_id
        self._add_bos = vocab.add_bos

        eog: set[int] = set()
        for source in (self._config, read_json(folder / "generation_config.json")):
            ids = source.get("eos_token_id")
            eog.update(ids if isinstance(ids, list) else [] if ids is None else [ids])
        if self.eos_id is not None:
            eog.add(self.eos_id)
        eog = ends_of_generation(vocab, eog)
        # llama.cpp's vocabulary also ends generation on its FIM pad, repository and file
        # separator tokens (SmolLM2's <reponame>)
        eog.update(i for i in self.fim_repo_tokens() if i is not None)
        eog.update(i for i in (self._first_token(_FIM_PAD_TEXTS),) if i is not None)
        self._eog = frozenset(int(i) for i in eog)

        self.chat_template: str | None = _read_chat_template(folder, tok_config)
        # request features beyond the basic sampler chain (not prompt scoring nor embeddings)
        self.features: frozenset[str] = frozenset({"logit_bias", "ignore_eos", "typical_p", "grammar", "logprobs", "template_vars"})
        self._template: Any = None

    def render_chat(self, messages: list[dict[str, Any]], **extra: Any) -> str:
        if self._template is None:
            self._template = compile_chat_template(self.chat_template)
        return render_chat_template(self._template, messages, bos_token=self.bos_text, eos_token=self.eos_text, **extra)

    def _token_masks(self) -> TokenMasks:
        if self._masks is None:
            from scheduler.engines.token_mask import TokenMasks

            n_vocab = max(int(self._config.get("vocab_size") or 0), self.vocab_size)  # the logits' width
            self._masks = TokenMasks(self.model_path / "tokenizer.json", n_vocab, sorted(self._eog), self._vocab.rendered)
        return self._masks

    def check_grammar(self, grammar: str) -> str | None:
        """None if llguidance compiles ``grammar`` (GBNF, root rule ``root``), else why not."""
        self._require_open()
        return self._token_masks().check(grammar)

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        # Special tokens written in the text are parsed as such unless ``special`` is off; BOS is
        # added by hand, once, and never EOS (a post-processor may add both), as llama.cpp's.
        # A text that continues earlier text (``after``: its last token) gets no space prefix
        # (a Metaspace pre-tokenizer's, a Prepend normalizer's: Llama 2's, Mistral's), which
        # the tokenizer gives each text it is given, and where it says so the text after an
        # added token (prepend_scheme "always", Prepend; not "first").
        self._require_open()
        if after is not None and text and self._space_prefix and not self._prefixed_after(after):
            continued = continued_tokens(lambda t: self._vocab.encode(t, special=special), self.token_bytes, text)
            if continued is not None:
                return continued
        return self._with_bos(text, self._vocab.encode(text, special=special), add_special)

    @functools.cached_property
    def _space_prefix(self) -> bool:
        """Whether the tokenizer prefixes a space to each text it tokenises."""
        return prefixes_space(lambda t: self._vocab.encode(t, special=False), self.token_bytes)

    def _prefixed_after(self, token: int) -> bool:
        """Whether the tokenizer prefixes a space to the text right after ``token`` in a text:
        an added token split out before the rest is tokenised, where the text after it counts
        as a text's start (tested on the token's text followed by a space-prefixed text)."""
        added = self._vocab.added.get(token)
        if added is None:
            return False
        ids = self._vocab.encode(added.content + "\x1f", special=True)
        return ids[:1] == [token] and b"".join(map(self.token_bytes, ids[1:])) == b" \x1f"

    def _token_piece(self, token: int) -> bytes:
        return self._vocab.piece(token, render_special=False)  # control tokens print nothing, as llama.cpp's

    def fim_tokens(self) -> tuple[int, int, int] | None:
        for names in _FIM_TEXTS:
            ids = [self._tok.token_to_id(n) for n in names]
            if all(i is not None for i in ids):
                return ids[0], ids[1], ids[2]  # type: ignore[return-value]
        return None

    def fim_repo_tokens(self) -> tuple[int | None, int | None]:
        """(file separator, repository name) ids, found by their text as llama.cpp's vocabulary
        finds FIM_SEP and FIM_REP (Qwen2.5-Coder's markers); None for one the model lacks."""
        return self._first_token(_FIM_SEP_TEXTS), self._first_token(_FIM_REP_TEXTS)

    def _first_token(self, texts: tuple[str, ...]) -> int | None:
        """The id of the first of ``texts`` the vocabulary has, as llama.cpp's looks them up."""
        return next((i for i in (self._tok.token_to_id(n) for n in texts) if i is not None), None)

    def is_eog(self, token: int) -> bool:
        return token in self._eog

    # -- ticks ------------------------------------------------------------------------

    # execute: LaneEngine's, run_tick over the primitives below

    # -- run_tick's primitives ------------------------------------------------------------

    def bind_sampler(self, bind: LaneBind) -> None:
        """A fresh sampler for the lane; a grammar gets a fresh matcher, and the tokens the job
        generated before (a parked lane resumed) are replayed into both, so penalties and the
        grammar continue exactly where they stopped; the random stream skips the draws made
        before (counted in the park artifact), so a seeded reply does too."""
        matcher = None
        if bind.sampling.grammar:
            from scheduler.engines.token_mask import GrammarCompileError

            try:
                matcher = self._token_masks().matcher(bind.sampling.grammar)
            except GrammarCompileError as exc:
                raise EngineError(f"could not build the request's grammar: {exc}", permanent=True) from None
        draws = bind.parked.draws if isinstance(bind.parked, MlxParkedKV) else None
        sampler = LaneSampler(bind.sampling, bind.history, eog=self._eog, draws=draws)
        if matcher is not None:
            # as llama.cpp's engine: replayed up to the first token the grammar rejects (a resumed
            # job's delivered text need not be the grammar's), constrained from there on
            history = list(bind.history)
            if matcher.accept_prefix(history) < len(history):
                log.warning("lane %d: the grammar rejects the text it resumes; constrained from the last token it accepted", bind.lane)
            sampler.grammar = matcher
        self._samplers[bind.lane] = sampler

    def drop_sampler(self, lane: int) -> None:
        self._samplers.pop(lane, None)
        self._step_logprobs.pop(lane, None)

    def swap_samplers(self, a: int, b: int) -> None:
        swap_keys(self._samplers, a, b)
        swap_keys(self._step_logprobs, a, b)

    def take_logprobs(self) -> dict[int, tuple[float, list[tuple[int, float]]]]:
        taken, self._step_logprobs = self._step_logprobs, {}
        return taken

    def take_failed(self) -> dict[int, str]:
        return {}  # llguidance's masks are not timed here (llama.cpp's are: see its engine)

    def bound_lanes(self) -> dict[int, LaneSampler]:
        return self._samplers

    def forward(self, step: Step) -> dict[int, int]:
        try:
            rows = self._step(step.pieces)
        except (RuntimeError, ValueError, MemoryError) as exc:
            # MLX's own failures (an allocation Metal refuses, one that fails): the protocol's
            # error, so the worker fails the running jobs and goes on, as after a failed
            # llama_decode; permanent, since the step's caches may be half updated
            raise EngineError(f"MLX failed a step: {exc}", permanent=True) from exc
        sampled: dict[int, int] = {}
        for lane, row in rows.items():
            sampler = self._samplers[lane]
            # a config.json may pad vocab_size past the tokenizer (the logits are that wide):
            # the padding's columns are no token, so they are never sampled
            sampled[lane] = sampler.sample(row[: self.vocab_size])
            if sampler.last_logprobs is not None:
                self._step_logprobs[lane] = sampler.last_logprobs
        return sampled

    def _step(self, pieces: list[Piece]) -> dict[int, np.ndarray]:
        """Append each piece to its lane's cache; the last position's logits of the pieces that
        sample. Positions are checked before anything runs, so a refused step changes nothing."""
        mx = self._mx
        for lane, start, tokens, _sample in pieces:
            if start != self._lens[lane]:
                raise EngineError(
                    f"inconsistent sequence positions: lane {lane} holds {self._lens[lane]} tokens, "
                    f"a feed starts at {start}",
                    permanent=True,
                )
            if start + len(tokens) > self.lane_ctx:
                raise EngineError(f"lane {lane} is full ({self.lane_ctx} tokens)", permanent=True)
        batches = self._decode_batches(pieces) if self.batch_decode else []
        batched = {p[0] for singles in batches for p in singles}
        out: dict[int, np.ndarray] = {}
        for singles in batches:
            lanes = tuple(p[0] for p in singles)
            caches = self._merged(lanes)
            y = self._model(mx.array([p[2] for p in singles]), cache=caches)
            rows = y[:, -1, :]
            mx.eval(rows, *[(c.keys, c.values) for c in caches])
            host = np.array(rows.astype(mx.float32))
            for j, (lane, _start, _tokens, sample) in enumerate(singles):
                self._lens[lane] += 1
                if sample:
                    out[lane] = host[j]
        for lane, _start, tokens, sample in pieces:
            if lane in batched:
                continue
            cache = self._cache(lane)
            # Like mlx-lm's generate: everything but the last token fills the cache without
            # computing logits (MLX is lazy: the head over the vocabulary never runs), then the
            # last token alone gives the row to sample from.
            head, tail = (tokens[:-1], tokens[-1:]) if sample else (tokens, [])
            if head:
                self._model(mx.array([head]), cache=cache)
                mx.eval([(c.keys, c.values) for c in cache])
            if tail:
                y = self._model(mx.array([tail]), cache=cache)
                row = y[0, -1, :]
                mx.eval(row, [(c.keys, c.values) for c in cache])
                out[lane] = np.array(row.astype(mx.float32))
            self._lens[lane] += len(tokens)
        return out

    # -- caches -----------------------------------------------------------------------

    def _decode_batches(self, pieces: list[Piece]) -> list[list[Piece]]:
        """The one-token pieces that decode batched, in batches of similar length: a batch cache
        is left-padded to its longest lane, so a lane far shorter than that one would hold (and
        the KV pool not count) many times its own tokens. From the longest down, a lane joins the
        current batch while the batch's longest is within ``_PAD_FACTOR`` times its length (plus
        ``_PAD_SLACK``); a batch of one lane runs in that lane's own cache."""
        singles = sorted((p for p in pieces if len(p[2]) == 1), key=lambda p: -self._lens[p[0]])
        batches: list[list[Piece]] = []
        for piece in singles:
            n = self._lens[piece[0]]
            if batches and self._lens[batches[-1][0][0]] <= _PAD_FACTOR * n + _PAD_SLACK:
                batches[-1].append(piece)
            else:
                batches.append([piece])
        # lane order within a batch, as before: the step's order
        order = {p[0]: i for i, p in enumerate(pieces)}
        return [sorted(b, key=lambda p: order[p[0]]) for b in batches if len(b) > 1]

    def _merged(self, lanes: tuple[int, ...]) -> list[Any]:
        """The per-layer batch caches of ``lanes``, merging them unless they already are."""
        if lanes not in self._groups:
            for lane in lanes:
                self._ungroup(lane)
            from mlx_lm.models.cache import BatchKVCache

            self._groups[lanes] = [
                BatchKVCache.merge([self._seqs[lane][layer] for lane in lanes]) for layer in range(self.n_layers)
            ]
            for lane in lanes:
                # the batch cache holds a copy of their KV now: keeping the per-lane caches would
                # hold it twice while the group decodes (_ungroup gives each lane its own again)
                self._seqs[lane] = []
        return self._groups[lanes]

    def _ungroup(self, seq: int) -> None:
        """Split the decode group holding ``seq`` (if any) back into per-lane caches."""
        group = next((g for g in self._groups if seq in g), None)
        if group is None:
            return
        caches = self._groups.pop(group)
        for row, lane in enumerate(group):
            self._seqs[lane] = [layer.extract(row) for layer in caches]

    def _cache(self, seq: int) -> list[Any]:
        """One sequence's own per-layer caches (split out of the decode group if merged)."""
        self._ungroup(seq)
        return self._seqs[seq]

    def clear(self, seq: int) -> None:
        self._ungroup(seq)
        self._seqs[seq] = self._make_cache(self._model)
        self._lens[seq] = 0

    def trim(self, seq: int, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` of the sequence's KV (sliced copies: MLX arrays are values)."""
        if not 0 < n_tokens <= self._lens[seq]:
            raise EngineError(f"cannot trim sequence {seq} holding {self._lens[seq]} to {n_tokens} tokens", permanent=True)
        self._seqs[seq] = self._sliced(self._cache(seq), n_tokens)
        self._lens[seq] = n_tokens

    def _sliced(self, source: list[Any], n_tokens: int) -> list[Any]:
        mx = self._mx
        caches = []
        for c in source:
            new = self._kv_cache()
            new.keys = mx.contiguous(c.keys[..., :n_tokens, :])
            new.values = mx.contiguous(c.values[..., :n_tokens, :])
            new.offset = n_tokens
            caches.append(new)
        mx.eval([(c.keys, c.values) for c in caches])
        return caches

    def save(self, seq: int) -> MlxParkedKV:
        mx = self._mx
        n = self._lens[seq]
        layers = []
        dtype = ""
        for c in self._cache(seq):
            if c.keys is None:
                continue
            dtype = str(c.keys.dtype).rsplit(".", 1)[-1]
            k, v = c.keys[..., :n, :], c.values[..., :n, :]
            if k.dtype == mx.bfloat16:
                k, v = k.astype(mx.float32), v.astype(mx.float32)
            layers.append((np.array(k), np.array(v)))
        sampler = self._samplers.get(seq)
        return MlxParkedKV(tuple(layers), n, dtype, sampler.draws if sampler is not None else None)

    def load(self, seq: int, artifact: Any) -> None:
        if not isinstance(artifact, MlxParkedKV):
            raise EngineError(f"cannot restore a {type(artifact).__name__} on MLX", permanent=True)
        if artifact.n_tokens and len(artifact.layers) != self.n_layers:
            raise EngineError(
                f"a parked KV of {len(artifact.layers)} layers cannot go into a {self.n_layers}-layer model",
                permanent=True,
            )
        if artifact.n_tokens > self.lane_ctx:
            raise EngineError(f"a parked KV of {artifact.n_tokens} tokens does not fit a lane", permanent=True)
        self.clear(seq)
        if artifact.n_tokens == 0:
            return
        mx = self._mx
        dtype = getattr(mx, artifact.dtype, None)
        caches = []
        for keys, values in artifact.layers:
            if keys.shape[2] != artifact.n_tokens or keys.shape[:2] != values.shape[:2]:
                raise EngineError("a parked KV whose arrays do not match its token count", permanent=True)
            c = self._kv_cache()
            c.keys, c.values = mx.array(keys), mx.array(values)
            if dtype is not None and c.keys.dtype != dtype:
                c.keys, c.values = c.keys.astype(dtype), c.values.astype(dtype)
            c.offset = artifact.n_tokens
            caches.append(c)
        mx.eval([(c.keys, c.values) for c in caches])
        self._seqs[seq] = caches
        self._lens[seq] = artifact.n_tokens

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        """Make ``dst`` hold the first ``n_tokens`` of ``src``'s KV (a copy, not a view that a
        later append to either could disturb: MLX arrays are values)."""
        self._check_seq(src)
        self._check_seq(dst)
        if not 0 < n_tokens <= self._lens[src]:
            raise EngineError(f"cannot copy {n_tokens} tokens from sequence {src} holding {self._lens[src]}", permanent=True)
        caches = self._sliced(self._cache(src), n_tokens)
        self.clear(dst)
        self._seqs[dst] = caches
        self._lens[dst] = n_tokens

    # -- checks and lifecycle ---------------------------------------------------------

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.n_lanes + self.cache_slots:
            raise EngineError(f"sequence {seq} out of range", permanent=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._groups = {}
        self._seqs = []
        self._samplers.clear()
        self._model = None


def mlx_model_meta(model: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The meta an MLX model gives without any work: ``n_embd`` (config.json's ``hidden_size``,
    a multimodal model's ``text_config``'s), ``n_params`` (a quantised layer's weights counted
    unpacked, as mlx-lm counts them: the model's parameters, not its packed words), ``size`` (the
    weights' bytes as loaded, scales and biases included). No ``ftype``: llama.cpp's names of
    GGUF types (Q4_1, ...) have no MLX counterpart."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    n_embd = config.get("hidden_size") or text.get("hidden_size") or config.get("d_model") or config.get("n_embd")
    leaves = tree_flatten(model.leaf_modules(), is_leaf=lambda m: isinstance(m, nn.Module))

    def count(module: Any) -> int:
        if hasattr(module, "bits") and hasattr(module, "weight"):  # a quantised layer: packed into 32-bit words
            return int(module.weight.size * 32 // module.bits) + (int(module.bias.size) if "bias" in module else 0)
        return sum(int(v.size) for _, v in tree_flatten(module.parameters()))

    return {
        "n_embd": int(n_embd) if isinstance(n_embd, int) and not isinstance(n_embd, bool) else None,
        "n_params": sum(count(m) for _, m in leaves),
        "size": sum(int(v.nbytes) for _, v in tree_flatten(model.parameters())),
    }


def _read_chat_template(folder: Path, tok_config: dict[str, Any]) -> str | None:
    """The template from tokenizer_config.json (a string, or named templates: "default"), or
    from chat_template.jinja / chat_template.json as newer Hugging Face exports write it."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tok_config.get("chat_template") or read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return str(template) if template else None
