"""The llama.cpp engine: one ``llama_context`` whose sequence ids are the scheduler's lanes.

Built on llama-cpp-python's low-level ctypes bindings only. The high-level ``Llama`` class keeps
one sequence and its own sampling loop; continuous batching needs direct control of
``llama_batch`` (which token goes to which sequence at which position) and of per-sequence
samplers, so everything here talks to the C API.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from scheduler.core.types import LaneBind, LaneFeed, SamplingParams, TickPlan, seed32
from scheduler.engines.base import EngineError, LaneEngine, Step, StepAborted, Unsupported, swap_keys
from scheduler.engines.chat import (
    builtin_chat_template,
    compile_chat_template,
    continued_tokens,
    prefixes_space,
    render_chat_template,
)
from scheduler.engines.sampling import logprobs_of, repeat_penalty_of
from scheduler.engines.threads import OTHERS_BUSY_CORES, OtherCpu, ThreadGovernor, step_kind

log = logging.getLogger("superfluid.engine")

# ggml_log_level (ggml.h): NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5.
_LOG_WARN = 3
_LOG_CONT = 5
_PENALTY_LAST_N = 64
# A temperature below this samples greedily. llama.cpp's temperature sampler divides the float32
# logits by it: at 1e-39 a logit of 20 overflows to inf, the draw's softmax turns to NaN and every
# token is garbage (SmolLM2 answered "ectableectable..."), where the reply should be the greedy
# one (the NumPy sampler's float64 division gives greedy there too). Logits would have to pass
# 3.4e8 to overflow above it, and any temperature this small picks the top logit anyway.
_MIN_TEMPERATURE = 1e-30
# jobs whose extra draws are kept after their lane's sampler was dropped (a finished job's stay
# until pushed out: a few bytes each)
_DROPPED_DRAWS_KEPT = 1024
# What a logit bias of -100 (and ignore_eos) becomes: a ban, but finite, so that when a grammar
# allows only banned tokens the draw still lands on one the grammar allows (an all -inf draw
# could accept a token the grammar rejects, which llama.cpp answers with an abort).
_BAN = -1.0e9
# Every lane of a step waits while a constrained lane's grammar masks the whole vocabulary (a
# JSON schema's mask takes ~3 ms on SmolLM2's 49k vocabulary and ~20 ms on Gemma 3's 262k; a
# rule of 1,000 alternatives 0.19 s and 1.7 s). A job's masks in steps it shares with other
# lanes draw on a credit of GRAMMAR_GRACE_S, which each such step refills by GRAMMAR_STALL_SHARE
# times its own decode time (at least GRAMMAR_FLOOR_S: a GPU's steps take milliseconds while
# masks still run on the CPU) up to GRAMMAR_GRACE_S again; when the credit runs out the job ends
# with grammar_too_slow. So a grammar's masks hold the others up at most GRAMMAR_GRACE_S at a
# time and, over any stretch, about as long as the steps' own decoding: at most double their
# time. An enum of 300 values, a legitimate schema, costs a few masks of 0.5 s on Gemma and
# passes within the grace.
GRAMMAR_GRACE_S = 5.0
GRAMMAR_STALL_SHARE = 1.0
GRAMMAR_FLOOR_S = 0.02
# llama.cpp dropped n_vocab from llama_sampler_init_penalties and some bindings still carry it;
# the argtypes say which C signature this build has.
_PENALTIES_TAKE_N_VOCAB = len(llama_cpp.llama_sampler_init_penalties.argtypes) == 5
# llama_token_data (llama.h) as numpy sees it: one row of logits fills a whole candidate array in
# two vector copies instead of a Python loop over the vocabulary
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


# -- logging ----------------------------------------------------------------------------
# llama.cpp logs through one process-wide callback. Without one it writes every model-load
# line to stderr; with a no-op we would lose the only explanation of a failed decode. So the
# callback drops everything below WARN and keeps the last warnings/errors for exceptions.

_recent_log: collections.deque[str] = collections.deque(maxlen=16)
_last_level = 0


def _on_log(level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
    global _last_level
    if level != _LOG_CONT:
        _last_level = level
    if _last_level >= _LOG_WARN and text:
        line = text.decode("utf-8", "replace").rstrip()
        if line:
            _recent_log.append(line)


# Module-level so ctypes never frees the trampoline while llama.cpp may still call it.
_log_callback = llama_cpp.llama_log_callback(_on_log)
_init_lock = threading.Lock()
_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    with _init_lock:
        if not _backend_ready:
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _backend_ready = True


def _flag_reader() -> int | None:
    """The address of a C function ``f(p)`` that is true when the byte at ``p`` is non-zero, for
    llama.cpp's abort callback: libc's ``strlen`` over a two-byte flag (b"\\x01\\x00" or
    b"\\x00\\x00": length 1 or 0). llama.cpp polls the callback after every graph node on a
    compute thread; a Python callback there would take the GIL hundreds of times a step and
    stall the other compute threads at their barrier whenever another thread of the worker
    holds it. None where no C library is found (steps are then not abortable)."""
    try:
        libc = ctypes.CDLL(None) if os.name != "nt" else ctypes.cdll.msvcrt
        return ctypes.cast(libc.strlen, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def _take_log() -> str:
    """Recent llama.cpp warnings/errors, for an exception message; clears them."""
    text = " | ".join(_recent_log)
    _recent_log.clear()
    return text


def gguf_meta_str(model: Any, key: bytes) -> str | None:
    """A loaded GGUF's metadata value as text, None when the model has no such key."""
    size = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_model_meta_val_str(model, key, buf, size)
        if n < 0:
            return None
        if n < size:
            return buf.value.decode("utf-8", "replace") or None
        size = n + 1


def gguf_chat_template(model: Any) -> str | None:
    """The chat template chats with a loaded GGUF are rendered with: its own (llama.cpp's reading,
    else the ``tokenizer.chat_template`` metadata), else its architecture's built-in one (Gemma's
    turns), else None: ChatML. The engine's and the web process's vocabulary (/apply-template) alike."""
    raw = llama_cpp.llama_model_chat_template(model, None)
    own = raw.decode("utf-8", "replace") if raw else gguf_meta_str(model, b"tokenizer.chat_template")
    return own or builtin_chat_template(gguf_meta_str(model, b"general.architecture"))


def _err(message: str, *, permanent: bool) -> EngineError:
    detail = _take_log()
    return EngineError(f"{message}: {detail}" if detail else message, permanent=permanent)


# -- extra buffer types (AMX, weight repacking) -----------------------------------------
# llama.cpp loads weights into "extra buffer types" when it can: the AMX buffer (a build with
# AMX_INT8 kernels on a CPU with AMX tiles) and the CPU repack buffer (Q4_0/IQ4_NL/Q4_K weights
# interleaved for the build's SIMD kernels). llama_model_params.use_extra_bufts turns both off
# together (llama-server's --no-repack); nothing finer is exposed. A native build on an
# AVX-512/AMX Xeon segfaults at its first decode with them on (issue 17) and decodes fine with
# them off, so --repack auto turns them off exactly where a build with those kernels meets a CPU
# with AMX, and leaves them on (the faster path) everywhere else.

REPACK_CHOICES = ("auto", "on", "off")


def build_features(system_info: str) -> set[str]:
    """The features llama_print_system_info() reports on, e.g. ``CPU : AVX2 = 1 | REPACK = 1 |``."""
    on: set[str] = set()
    for part in system_info.replace("\n", "|").split("|"):
        name, sep, value = part.partition("=")
        if sep and value.strip() == "1":
            on.add(name.rpartition(":")[2].strip().upper())
    return on


def cpu_flags(cpuinfo: str) -> set[str]:
    """The CPU's flags from the first ``flags`` line of /proc/cpuinfo."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return set()


def extra_bufts_hazard(system_info: str, cpuinfo: str) -> str | None:
    """Why the extra buffer types should stay off on this build and CPU, or None."""
    kernels = build_features(system_info) & {"AMX_INT8", "AVX512"}
    amx = cpu_flags(cpuinfo) & {"amx_tile", "amx_int8"}
    if kernels and amx:
        return f"this llama.cpp build has {'/'.join(sorted(kernels))} kernels and the CPU has AMX ({' '.join(sorted(amx))})"
    return None


def choose_repack(requested: str, system_info: str, cpuinfo: str) -> tuple[bool, str | None]:
    """(use extra buffer types, the line that says why auto turned them off) for ``--repack``."""
    if requested not in REPACK_CHOICES:
        raise ValueError(f"--repack must be {', '.join(REPACK_CHOICES)}; got {requested!r}")
    if requested != "auto":
        return requested == "on", None
    hazard = extra_bufts_hazard(system_info, cpuinfo)
    if hazard is None:
        return True, None
    return False, (
        f"llama.cpp extra buffer types (AMX, weight repacking) off: {hazard}, where decoding with them "
        "crashes; --repack on (or SUPERFLUID_REPACK=on) turns them back on"
    )


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:  # not Linux: no AMX detection, llama.cpp's defaults
        return ""


def repack_here(requested: str) -> tuple[bool, str | None]:
    """:func:`choose_repack` for the llama.cpp build imported here and this machine's CPU."""
    return choose_repack(requested, llama_cpp.llama_print_system_info().decode("utf-8", "replace"), _read_cpuinfo())


# -- artifacts --------------------------------------------------------------------------


class _Candidates:
    """A reusable ``llama_token_data_array`` over the whole vocabulary, filled from one row of
    logits: what ``llama_sampler_sample`` builds inside C, built here so that a constrained lane
    can run its chain and its grammar separately (:meth:`LlamaCppEngine._sample_constrained`)."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self._data = (llama_cpp.llama_token_data * n_vocab)()
        self._rows = np.frombuffer(memoryview(self._data), dtype=_TOKEN_DATA)  # shares the C array's memory
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self.array = llama_cpp.llama_token_data_array(data=self._data, size=n_vocab, selected=-1, sorted=False)
        self.ref = ctypes.pointer(self.array)
        self._one = (llama_cpp.llama_token_data * 1)()
        self._one_array = llama_cpp.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)
        self._one_ref = ctypes.pointer(self._one_array)

    def fill(self, logits: Any) -> None:
        self._rows["id"] = self._ids  # samplers sort the rows in place: every fill starts afresh
        self._rows["logit"] = np.ctypeslib.as_array(logits, shape=(self.n_vocab,))
        self._rows["p"] = 0.0
        self.array.data, self.array.size, self.array.selected, self.array.sorted = self._data, self.n_vocab, -1, False

    def chosen(self) -> int:
        return int(self.array.data[self.array.selected].id)

    def pick_masked(self, logits: Any, grammar: Any, chain: Any) -> int:
        """The chain's pick among the tokens ``grammar`` allows (the whole vocabulary masked).

        A token the grammar rejects is -inf through the whole chain, and a sound draw never picks
        -inf. When every allowed token is a ban the chain pushed to -inf too (a temperature of
        1e-30 divides -1e9 past float32's range, a huge repeat penalty multiplies a generated
        one), the draw's softmax is NaN and lands anywhere; accepting a rejected token throws in
        llama.cpp's C++ and ends the process. Then the likeliest allowed token by the raw logits."""
        self.fill(logits)
        llama_cpp.llama_sampler_apply(grammar, self.ref)
        llama_cpp.llama_sampler_apply(chain, self.ref)
        selected = self.array.selected
        if 0 <= selected < self.array.size and self.array.data[selected].logit > -math.inf:
            return self.chosen()
        self.fill(logits)
        llama_cpp.llama_sampler_apply(grammar, self.ref)
        return int(self._rows["id"][int(np.argmax(self._rows["logit"]))])

    def allows(self, grammar: Any, token: int) -> bool:
        """Whether ``grammar`` in its present state accepts ``token`` next: the grammar applied to
        a one-token candidate array (microseconds; the whole vocabulary takes milliseconds)."""
        self._one[0] = llama_cpp.llama_token_data(token, 1.0, 0.0)
        self._one_array.data, self._one_array.size, self._one_array.selected, self._one_array.sorted = self._one, 1, -1, False
        llama_cpp.llama_sampler_apply(grammar, self._one_ref)
        return not math.isinf(self._one[0].logit)


@dataclass(frozen=True)
class ParkedKV:
    """A lane's KV cache copied to host memory while its job is preempted."""

    data: bytes
    n_tokens: int
    # the lane's sampler drew this many times more than it sampled tokens (a constrained pick
    # the grammar rejected draws again): where its random stream resumes, with the tokens
    extra_draws: int = 0

    @property
    def nbytes(self) -> int:
        return len(self.data)


def _greedy(sp: SamplingParams) -> bool:
    """Whether the lane samples greedily: temperature 0, or one too small to divide by."""
    return sp.temperature < _MIN_TEMPERATURE


def _skip_draws(chain: Any, n: int) -> None:
    """Advance the chain's seeded draw (its last sampler, when it is llama.cpp's ``dist``) by
    ``n`` draws: ``dist`` draws once per application whatever the candidates, so applying it to
    a one-token array ``n`` times moves its random stream as ``n`` samples did."""
    L = llama_cpp
    if n <= 0:
        return
    dist = L.llama_sampler_chain_get(chain, L.llama_sampler_chain_n(chain) - 1)
    if L.llama_sampler_name(dist) != b"dist":
        return  # greedy: nothing random to resume
    one = (L.llama_token_data * 1)()
    array = L.llama_token_data_array(data=one, size=1, selected=-1, sorted=False)
    ref = ctypes.pointer(array)
    for _ in range(n):
        L.llama_sampler_apply(dist, ref)


# -- the engine -------------------------------------------------------------------------


def _fill_one_sequence(batch: Any, tokens: list[int], start: int) -> None:
    """``batch`` holds ``tokens`` of sequence 0 at positions from ``start``, logits on every row
    (the prompt-scoring and embeddings contexts)."""
    for j, token in enumerate(tokens):
        batch.token[j], batch.pos[j], batch.n_seq_id[j] = token, start + j, 1
        batch.seq_id[j][0] = 0
        batch.logits[j] = 1
    batch.n_tokens = len(tokens)


# the tokens the embeddings context kept between requests takes (llama-server's default ubatch)
EMBED_KEPT_TOKENS = 512


class LlamaCppEngine(LaneEngine):
    name = "llamacpp"
    # request features beyond the basic sampler chain that this engine honours
    features = frozenset({"logit_bias", "ignore_eos", "typical_p", "grammar", "logprobs", "template_vars", "prompt_logprobs", "embeddings"})

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_lanes: int = 8,
        lane_ctx: int = 4096,
        n_threads: int | None = None,
        kv_unified: bool = False,
        max_step_tokens: int = 512,
        cache_slots: int = 0,
        repack: str = "auto",
        adapt_threads: bool = True,
    ) -> None:
        self._set_lanes(n_lanes, lane_ctx, max_step_tokens, cache_slots)
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise FileNotFoundError(f"model file not found: {self.model_path}")
        self.kv_unified = kv_unified
        self.n_threads = n_threads or os.cpu_count() or 1
        # the compute threads of each step, chosen by measurement (scheduler/engines/threads.py)
        self.threads = ThreadGovernor(self.n_threads) if adapt_threads and self.n_threads > 1 else None
        self._others = OtherCpu() if self.threads is not None else None
        self._threads_set = self.n_threads
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        self._samplers: dict[int, Any] = {}  # lane -> its sampler chain (without the grammar)
        self._extra_draws: dict[int, int] = {}  # lane -> draws beyond one per token (ParkedKV)
        # A job preempted without a park (--no-park, critical OS pressure, a park that failed)
        # is bound again with its output as history and no artifact: its extra draws are kept
        # here, by job id, from when its lane's sampler was dropped until it is bound again, so
        # its random stream still goes on where it was (the most recent _DROPPED_DRAWS_KEPT).
        self._lane_jobs: dict[int, str] = {}  # lane -> the job its sampler was bound for
        self._dropped_draws: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._argmax_lanes: set[int] = set()  # lanes whose chain is plain greedy: argmax of the logits row
        self._grammars: dict[int, Any] = {}  # lane -> its grammar sampler, for constrained lanes
        # lane -> (the grammar's credit left in seconds, seconds of full masks in shared steps,
        # tokens sampled under the grammar in them)
        self._mask_cost: dict[int, tuple[float, float, int]] = {}
        self._decode_s = 0.0  # the last llama_decode's time
        self._failed: dict[int, str] = {}  # lane -> why its job must end, until taken
        self._candidates: _Candidates | None = None  # made when the first constrained lane binds
        self._logprob_lanes: dict[int, int] = {}  # lane -> top alternatives wanted
        self._step_logprobs: dict[int, tuple[float, list[tuple[int, float]]]] = {}  # the last forward's, until taken
        self._eog_ids: list[int] | None = None
        self._score_ctx: Any = None  # a one-sequence context for scoring prompts, made on first use
        self._score_lock = threading.Lock()
        self._embed_ctx: Any = None  # a one-sequence embeddings context (pooled), made on first use

        _init_backend()
        # use_extra_bufts as llama-server's --no-repack sets it; see choose_repack
        self.repack, self.repack_note = repack_here(repack)
        max_seq = llama_cpp.llama_max_parallel_sequences()
        if n_lanes + cache_slots > max_seq:
            raise ValueError(f"n_lanes + cache_slots must be at most {max_seq} (llama.cpp's sequence limit)")

        mparams = llama_cpp.llama_model_default_params()
        # A ctypes Structure takes any attribute name silently: check the field is C's.
        if any(field[0] == "use_extra_bufts" for field in mparams._fields_):
            mparams.use_extra_bufts = self.repack
        elif not self.repack:
            raise EngineError(
                "--repack off needs a llama-cpp-python whose llama_model_params has use_extra_bufts "
                "(requirements.txt pins one)",
                permanent=True,
            )
        self._model = llama_cpp.llama_model_load_from_file(str(self.model_path).encode(), mparams)
        if not self._model:
            raise _err(f"could not load model {self.model_path}", permanent=True)
        self._closed = False
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        L = llama_cpp
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_ctx_train: int = L.llama_model_n_ctx_train(self._model)
        self.vocab_size: int = L.llama_vocab_n_tokens(self._vocab)
        # llama-server's /v1/models meta and /props' model_ftype (the worker's hello carries them)
        ftype = L.llama_ftype_name(L.llama_model_ftype(self._model))
        self.model_meta: dict[str, Any] = {
            "n_embd": int(L.llama_model_n_embd(self._model)),
            "n_params": int(L.llama_model_n_params(self._model)),
            "size": int(L.llama_model_size(self._model)),
            "ftype": ftype.decode("utf-8", "replace") if ftype else None,
        }

        cparams = L.llama_context_default_params()
        # With per-sequence KV streams (kv_unified=False) llama.cpp splits n_ctx evenly across
        # n_seq_max sequences, so each lane gets exactly lane_ctx positions.
        cparams.n_ctx = self.lane_ctx * (self.n_lanes + self.cache_slots)
        cparams.n_seq_max = self.n_lanes + self.cache_slots
        cparams.n_batch = self.max_step_tokens
        cparams.n_ubatch = self.max_step_tokens
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.kv_unified = self.kv_unified
        cparams.no_perf = True
        self._ctx = L.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise _err("could not create llama.cpp context", permanent=True)
        self._mem = L.llama_get_memory(self._ctx)
        # With a KV stream per sequence llama.cpp puts only consecutive sequence ids in one
        # ubatch, a pass over the weights each: the scheduler keeps busy lanes in one run.
        self.compact_lanes = not self.kv_unified

        # Abortable steps: abort_step() sets the flag from any thread; llama.cpp stops the
        # running llama_decode at its next graph node and removes that ubatch's cells from the
        # KV cache, and forward() trims the rest of the step (see there). Only steps that carry
        # prompt tokens watch the flag; a decode round is short and every stream waits for it.
        self._abort_flag = ctypes.create_string_buffer(2)
        self._no_abort = ctypes.create_string_buffer(2)
        self._abort_watching = False
        # The prompt step in flight, for an abort that may wait for its end (step_eta): its
        # serial, when it is expected to end (perf_counter; None: none runs, or no rate is
        # measured yet), and the measured seconds a token.
        self._step_lock = threading.Lock()
        self._step_serial = 0
        self._step_ends: float | None = None
        self._prefill_s_per_token: float | None = None
        reader = _flag_reader() if hasattr(L, "llama_set_abort_callback") else None
        self.abortable = reader is not None
        if reader is not None:
            self._abort_fn = L.ggml_abort_callback(reader)
            L.llama_set_abort_callback(self._ctx, self._abort_fn, ctypes.addressof(self._no_abort))

        # One batch for the engine's life. Views over its C arrays let the hot path write
        # whole runs of tokens/positions with slice assignment instead of per-element ctypes
        # pointer indexing.
        cap = self.max_step_tokens
        self._batch = L.llama_batch_init(cap, 0, 1)
        b = self._batch

        def addr(ptr: Any) -> int:
            value = ctypes.cast(ptr, ctypes.c_void_p).value
            assert value is not None
            return value

        self._b_token = (ctypes.c_int32 * cap).from_address(addr(b.token))
        self._b_pos = (ctypes.c_int32 * cap).from_address(addr(b.pos))
        self._b_logits_addr = addr(b.logits)
        self._b_logits = (ctypes.c_int8 * cap).from_address(self._b_logits_addr)
        n_seq_id = (ctypes.c_int32 * cap).from_address(addr(b.n_seq_id))
        n_seq_id[:] = [1] * cap  # every token belongs to exactly one lane, always
        self._b_seq = [ctypes.c_int32.from_address(addr(b.seq_id[i])) for i in range(cap)]

        self._pieces: dict[int, bytes] = {}
        self.bos_id: int = L.llama_vocab_bos(self._vocab)
        self.eos_id: int = L.llama_vocab_eos(self._vocab)
        self.bos_text = self._special_text(self.bos_id)
        self.eos_text = self._special_text(self.eos_id)
        self._add_bos: bool = bool(L.llama_vocab_get_add_bos(self._vocab))
        # a GGUF without a template gets its architecture's (Gemma's turns), else ChatML
        self.chat_template: str | None = gguf_chat_template(self._model)
        self._template: Any = None

    # -- protocol: text ---------------------------------------------------------------

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", "replace")

    def _compiled_template(self) -> Any:
        if self._template is None:
            self._template = compile_chat_template(self.chat_template)
        return self._template

    def render_chat(self, messages: list[dict[str, Any]], **extra: Any) -> str:
        """The model's chat template applied to ``messages`` with the generation prompt added;
        ``extra`` are more template variables (``tools``, chat_template_kwargs). Template errors
        are ``ValueError`` (see ``scheduler.engines.chat``)."""
        return render_chat_template(
            self._compiled_template(), messages, bos_token=self.bos_text, eos_token=self.eos_text, **extra
        )

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        self._require_open()
        # A text that continues earlier text (``after``: its last token) gets no space prefix
        # (SentencePiece's add_space_prefix), which llama.cpp gives each raw fragment first in
        # its call or right after a special one (llama-vocab.cpp: is_prev_special)
        if after is not None and text and self._space_prefix and not self._special_fragment(after):
            continued = continued_tokens(lambda t: self.tokenize(t, add_special=False, special=special), self.token_bytes, text)
            if continued is not None:
                return continued
        # BOS is added by hand rather than through llama_tokenize(add_special=True), which
        # would also append EOS/SEP for vocabularies that ask for them: wrong for a prompt.
        return self._with_bos(text, self._llama_tokenize(text, False, special), add_special)

    def _llama_tokenize(self, text: str, add_special: bool, special: bool) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 8
        while True:
            buf = (llama_cpp.llama_token * size)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, size, add_special, special)
            if n >= 0:
                return list(buf[:n])
            size = -n

    def embedding_tokens(self, text: str) -> list[int]:
        """``text`` as an /v1/embeddings input, tokenised as llama-server tokenises one: with the
        vocabulary's own special tokens, an EOS/SEP after it too where the GGUF asks for one
        (``add_eos_token``: embedding models that pool the last token, BERT's family)."""
        self._require_open()
        return self._llama_tokenize(text, True, True)

    @functools.cached_property
    def _space_prefix(self) -> bool:
        """Whether the vocabulary prefixes a space to each text it tokenises (Llama 2's)."""
        return prefixes_space(lambda t: self.tokenize(t, add_special=False, special=False), self.token_bytes)

    def _special_fragment(self, token: int) -> bool:
        """Whether llama.cpp splits ``token`` out of a text before tokenising the rest (a control,
        user-defined or unknown token): raw text right after it gets the space prefix."""
        attr = llama_cpp.llama_vocab_get_attr(self._vocab, token)
        return bool(attr & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN))

    def _token_piece(self, token: int) -> bytes:
        self._require_open()
        # A buffer per miss, not a shared one: a request thread may detokenize while the
        # engine thread does too, and misses stop once the vocabulary seen so far is cached.
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return ctypes.string_at(buf, max(n, 0))

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """(prefix, suffix, middle) token ids for fill-in-the-middle, None if the model has none."""
        self._require_open()
        ids = (
            llama_cpp.llama_vocab_fim_pre(self._vocab),
            llama_cpp.llama_vocab_fim_suf(self._vocab),
            llama_cpp.llama_vocab_fim_mid(self._vocab),
        )
        if any(i == llama_cpp.LLAMA_TOKEN_NULL for i in ids):
            return None
        return ids

    def fim_repo_tokens(self) -> tuple[int | None, int | None]:
        """(FIM_SEP, FIM_REP) token ids, each None where the vocabulary has none."""
        self._require_open()
        sep = llama_cpp.llama_vocab_fim_sep(self._vocab)
        rep = llama_cpp.llama_vocab_fim_rep(self._vocab)
        null = llama_cpp.LLAMA_TOKEN_NULL
        return (None if sep == null else int(sep)), (None if rep == null else int(rep))

    def is_eog(self, token: int) -> bool:
        self._require_open()
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # -- protocol: ticks --------------------------------------------------------------

    # execute: LaneEngine's, run_tick over the primitives below

    # -- run_tick's primitives ------------------------------------------------------------

    def clear(self, seq: int) -> None:
        llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)

    def trim(self, seq: int, n_tokens: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq, n_tokens, -1):
            raise EngineError(f"could not trim sequence {seq} to {n_tokens} tokens", permanent=True)

    def bind_sampler(self, bind: LaneBind) -> None:
        self.drop_sampler(bind.lane)
        chain, grammar = self._build_sampler(bind.sampling)
        self._samplers[bind.lane] = chain
        if grammar is not None:
            self._grammars[bind.lane] = grammar
            if self._candidates is None:
                self._candidates = _Candidates(self.vocab_size)
        elif _greedy(bind.sampling) and llama_cpp.llama_sampler_chain_n(chain) == 1:
            self._argmax_lanes.add(bind.lane)  # the chain is the greedy sampler alone
        if bind.sampling.logprobs is not None:
            self._logprob_lanes[bind.lane] = bind.sampling.logprobs
        # replaying the accepted tokens rebuilds penalties and the grammar's state, so a
        # constrained lane resumes where it was parked
        for token in bind.history:
            llama_cpp.llama_sampler_accept(chain, token)
            if grammar is None:
                continue
            assert self._candidates is not None
            if not self._candidates.allows(grammar, token):
                # a resumed job's delivered text, tokenised again, need not be the grammar's
                # (a vocabulary that adds a leading space): accepting a token the grammar
                # rejects throws in C++ and ends the process. The grammar goes on from here.
                log.warning("lane %d: the grammar rejects the text it resumes; constrained from the last token it accepted", bind.lane)
                grammar = None
                continue
            llama_cpp.llama_sampler_accept(grammar, token)
        # a seeded draw goes on from where the job's random stream was, not from its seed (an
        # unseeded chain has a fresh random seed: nothing to skip)
        extra = bind.parked.extra_draws if isinstance(bind.parked, ParkedKV) else 0
        dropped = self._dropped_draws.pop(bind.job_id, 0)
        if bind.parked is None and bind.history:
            extra = dropped  # preempted without a park: its KV computed again, its stream resumed
        self._lane_jobs[bind.lane] = bind.job_id
        if extra:
            self._extra_draws[bind.lane] = extra
        if bind.sampling.seed is not None:
            _skip_draws(chain, len(bind.history) + extra)

    def bound_lanes(self) -> dict[int, Any]:
        return self._samplers

    def forward(self, step: Step) -> dict[int, int]:
        """One ``llama_decode`` call over the step's pieces, then each sampling lane's chain
        over its row of logits. A failed call raises EngineError (llama.cpp rolls back a call
        that returns 1; earlier calls of the tick stay in the KV cache)."""
        tok, pos, seq, logits = self._b_token, self._b_pos, self._b_seq, self._b_logits
        n_step = sum(len(piece.tokens) for piece in step.pieces)
        ctypes.memset(self._b_logits_addr, 0, n_step)
        n = 0
        outputs: list[tuple[int, int]] = []  # (lane, batch index) to sample after the call
        # in sequence order: with a KV stream per sequence, llama.cpp puts only consecutive
        # sequences in one ubatch, each a pass over the weights (lanes 0,2,4,6,1,3,5,7 took four
        # passes where 0..7 take one)
        for lane, start, tokens, wants_sample in sorted(step.pieces, key=lambda p: p.lane):
            k = len(tokens)
            end = n + k
            if k == 1:
                tok[n] = tokens[0]
                pos[n] = start
                seq[n].value = lane
            else:
                tok[n:end] = tokens
                pos[n:end] = range(start, start + k)
                for j in range(n, end):
                    seq[j].value = lane
            if wants_sample:
                logits[end - 1] = 1
                outputs.append((lane, end - 1))
            n = end
        self._batch.n_tokens = n
        self._watch_abort(step.prefill)
        governor = self.threads
        if governor is not None:
            kind = step_kind(step.prefill, n)
            threads = governor.threads_for(kind)
            if threads != self._threads_set:
                llama_cpp.llama_set_n_threads(self._ctx, threads, threads)
                self._threads_set = threads
        watched = step.prefill and self.abortable
        started = time.perf_counter()
        if watched:
            rate = self._prefill_s_per_token
            with self._step_lock:
                self._step_serial += 1
                self._step_ends = None if rate is None else started + n * rate
        ret = llama_cpp.llama_decode(self._ctx, self._batch)
        self._decode_s = time.perf_counter() - started
        if watched:
            with self._step_lock:
                self._step_ends = None
            if ret == 0:  # the rate of the last prompt steps (any size: it estimates, a timer bounds)
                per_token = self._decode_s / max(1, n)
                self._prefill_s_per_token = per_token if rate is None else (rate + per_token) / 2
        if governor is not None and ret == 0:
            before, was_kept = governor.current, kind in governor.kept
            others = self._others.cores() if self._others is not None else None
            governor.others_busy = others is not None and others >= OTHERS_BUSY_CORES
            governor.observe(threads, kind, self._decode_s, n)
            if governor.current != before:
                log.info("compute threads %d -> %d: %s steps measured faster with %d", before, governor.current, kind, governor.current)
            elif kind in governor.kept and not was_kept:
                log.info("compute threads: %s steps keep %d, clearly slower with %d", kind, governor.kept[kind], governor.current)
        if ret == 2 and step.prefill:
            # llama.cpp rolls back only the ubatch it was in: a step that mixes a decode token
            # with prompt tokens is split into several ubatches, and those already done stay in
            # the KV cache. Trim every piece's lane back to where the step started, so the step
            # is all or nothing and the plan's positions stay right.
            for piece in step.pieces:
                llama_cpp.llama_memory_seq_rm(self._mem, piece.lane, piece.start, -1)
            _take_log()  # llama.cpp's note that it removed the step's cells
            raise StepAborted("step aborted")
        if ret != 0:
            raise _err(f"llama_decode returned {ret}", permanent=ret < 0)
        sample, ctx, samplers, grammars, logprob_lanes = llama_cpp.llama_sampler_sample, self._ctx, self._samplers, self._grammars, self._logprob_lanes
        argmax_lanes, row, n_vocab = self._argmax_lanes, llama_cpp.llama_get_logits_ith, (self.vocab_size,)
        sampled: dict[int, int] = {}
        shared = len(step.pieces) > 1  # other lanes wait for this step's masks
        for lane, index in outputs:
            grammar = grammars.get(lane)
            if lane in argmax_lanes:
                # the greedy chain's pick (the first highest logit) without building its
                # 49k-entry candidate array in C: a third of the time, ~1% of a round of 8 lanes
                token = sampled[lane] = int(np.ctypeslib.as_array(row(ctx, index), shape=n_vocab).argmax())
            elif grammar is None:
                token = sampled[lane] = sample(samplers[lane], ctx, index)
            else:
                token = sampled[lane] = self._sample_constrained(samplers[lane], grammar, index, lane, shared)
            if lane in logprob_lanes:  # read before the next decode overwrites this row of logits
                self._step_logprobs[lane] = self._logprobs(index, token, logprob_lanes[lane])
        return sampled

    def _sample_constrained(self, chain: Any, grammar: Any, index: int, lane: int, shared: bool) -> int:
        """Sample a constrained lane as llama-server does: the chain picks from the whole
        vocabulary and the grammar checks only that token; when it is rejected, the grammar masks
        the whole vocabulary and the chain picks again from what it allows. Greedy picks are the
        same as masking first (the best allowed token); the full mask, milliseconds on a 49k
        vocabulary, runs only on rejections (inside a JSON string, few picks are)."""
        assert self._candidates is not None  # made when the lane bound its grammar
        cand, logits = self._candidates, llama_cpp.llama_get_logits_ith(self._ctx, index)
        cand.fill(logits)
        llama_cpp.llama_sampler_apply(chain, cand.ref)
        token = cand.chosen()
        masked_s = 0.0
        if not cand.allows(grammar, token):
            started = time.perf_counter()
            token = cand.pick_masked(logits, grammar, chain)
            self._extra_draws[lane] = self._extra_draws.get(lane, 0) + 1  # the chain ran twice
            masked_s = time.perf_counter() - started
        if shared:
            self._charge_mask(lane, masked_s)
        llama_cpp.llama_sampler_accept(grammar, token)
        llama_cpp.llama_sampler_accept(chain, token)
        return token

    def take_logprobs(self) -> dict[int, tuple[float, list[tuple[int, float]]]]:
        taken, self._step_logprobs = self._step_logprobs, {}
        return taken

    def _charge_mask(self, lane: int, seconds: float) -> None:
        """One token sampled under the lane's grammar in a step other lanes shared, whose full
        mask (0 when none ran) took ``seconds``: the step refills the lane's credit, the mask
        spends it, and a job whose credit runs out must end."""
        credit, spent, tokens = self._mask_cost.get(lane, (GRAMMAR_GRACE_S, 0.0, 0))
        earned = max(GRAMMAR_STALL_SHARE * self._decode_s, GRAMMAR_FLOOR_S)
        credit = min(GRAMMAR_GRACE_S, credit + earned) - seconds
        spent, tokens = spent + seconds, tokens + 1
        self._mask_cost[lane] = (credit, spent, tokens)
        if credit < 0 and lane not in self._failed:
            self._failed[lane] = (
                f"The grammar's masks held the other requests up for {spent:.1f} s over {tokens} tokens, more than "
                f"one request may ({GRAMMAR_GRACE_S:g} s at a time, and over time as long as the steps' own decoding): "
                "a rule with too many alternatives (a long enum, say)."
            )

    def take_failed(self) -> dict[int, str]:
        taken, self._failed = self._failed, {}
        return taken

    def abort_step(self, serial: int | None = None) -> None:
        """Stop the step in flight if it carries prompt tokens, and any such step until
        :meth:`clear_abort` (thread-safe: one byte store). With ``serial`` (from
        :meth:`step_eta`): only that prompt step, if it still runs, none begun after it."""
        if serial is None:
            self._abort_flag[0] = b"\x01"
            return
        with self._step_lock:
            if self._step_ends is not None and self._step_serial == serial:
                self._abort_flag[0] = b"\x01"

    def step_eta(self) -> tuple[int, float] | None:
        """The prompt step in flight: its serial and the seconds it is expected still to take
        (from the measured rate of the last prompt steps); None when none runs or no rate is
        measured yet."""
        with self._step_lock:
            if self._step_ends is None:
                return None
            return self._step_serial, self._step_ends - time.perf_counter()

    def clear_abort(self) -> None:
        self._abort_flag[0] = b"\x00"

    def _watch_abort(self, watch: bool) -> None:
        if self.abortable and watch != self._abort_watching:
            flag = self._abort_flag if watch else self._no_abort
            llama_cpp.llama_set_abort_callback(self._ctx, self._abort_fn, ctypes.addressof(flag))
            self._abort_watching = watch

    def probe(self) -> None:
        """Decode a few tokens through the path requests take (a prompt batch on two lanes, then
        a decode round), then free the lanes again. The worker runs it before it reports ready,
        so kernels that crash on this CPU kill the worker at start-up, not at the first request."""
        lanes = sorted({0, min(1, self.n_lanes - 1)})
        prompt = self.tokenize("The quick brown fox jumps over the lazy dog.")[:8]
        greedy = SamplingParams(temperature=0.0)
        plan = TickPlan(tick=0)
        for lane in lanes:
            plan.bind.append(LaneBind(lane=lane, job_id="probe", sampling=greedy))
            plan.feeds.append(LaneFeed(lane=lane, job_id="probe", start_pos=0, tokens=prompt, sample=True))
        first = self.execute(plan, lambda: False)
        plan = TickPlan(tick=1)
        for lane in lanes:
            plan.feeds.append(
                LaneFeed(lane=lane, job_id="probe", start_pos=len(prompt), tokens=[first.sampled[lane]], sample=True, decode=True)
            )
        self.execute(plan, lambda: False)
        self.execute(TickPlan(tick=2, release=lanes), lambda: False)

    def save(self, lane: int) -> ParkedKV:
        L = llama_cpp
        n_tokens = L.llama_memory_seq_pos_max(self._mem, lane) + 1
        size = L.llama_state_seq_get_size(self._ctx, lane)
        buf = (ctypes.c_uint8 * size)()
        written = L.llama_state_seq_get_data(self._ctx, buf, size, lane)
        if written == 0 and size > 0:
            raise _err(f"could not copy lane {lane}'s KV cache", permanent=False)
        return ParkedKV(ctypes.string_at(buf, written), max(n_tokens, 0), self._extra_draws.get(lane, 0))

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.n_lanes + self.cache_slots:
            raise EngineError(f"sequence {seq} out of range", permanent=True)

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        """Make ``dst`` hold the first ``n_tokens`` of ``src``'s KV.

        With per-sequence KV streams, ``llama_memory_seq_cp`` between two sequences only
        supports whole-stream copies (llama.cpp asserts on a range), copies the stream's full
        buffer (``lane_ctx`` cells, not just the used ones) and defers the copy to the next
        ``llama_decode``, so a park or eviction of ``dst`` before then would read stale cells.
        Going through the sequence state instead copies only the used cells and is done when
        this returns; the trim keeps the shared prefix."""
        self._check_seq(src)
        self._check_seq(dst)
        state = self.save(src)
        self.load(dst, state)
        llama_cpp.llama_memory_seq_rm(self._mem, dst, n_tokens, -1)

    def load(self, lane: int, artifact: Any) -> None:
        self._check_seq(lane)
        if not isinstance(artifact, ParkedKV):
            raise EngineError(f"cannot restore a {type(artifact).__name__}", permanent=True)
        L = llama_cpp
        L.llama_memory_seq_rm(self._mem, lane, -1, -1)
        data = artifact.data
        # c_char_p points at the bytes object's own buffer: no copy of a possibly large state.
        src = ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))
        if L.llama_state_seq_set_data(self._ctx, src, len(data), lane) == 0:
            L.llama_memory_seq_rm(self._mem, lane, -1, -1)
            raise _err(f"could not restore KV into lane {lane}", permanent=False)

    def score_prompt(self, tokens: list[int], top: int) -> list[tuple[float, list[tuple[int, float]]]]:
        """The model's logprob of each prompt token after the ones before it (and the ``top``
        likeliest there), for completions ``echo`` + ``logprobs``: one entry per token but the
        first. It runs in a context of its own (one sequence, logits on every row), so no lane
        and no cached prefix is touched; the worker calls it while preparing the job."""
        L = llama_cpp
        self._require_open()
        with self._score_lock:
            self._require_open()  # again: close() may have run while this waited for the lock
            if self._score_ctx is None:
                cparams = L.llama_context_default_params()
                cparams.n_ctx = self.lane_ctx
                cparams.n_seq_max = 1
                cparams.n_batch = cparams.n_ubatch = min(self.lane_ctx, 512)
                cparams.n_threads = cparams.n_threads_batch = self.n_threads
                cparams.no_perf = True
                self._score_ctx = L.llama_init_from_model(self._model, cparams)
                if not self._score_ctx:
                    self._score_ctx = None
                    raise _err("could not create the prompt-scoring context", permanent=False)
            ctx = self._score_ctx
            chunk = min(self.lane_ctx, 512)
            batch = L.llama_batch_init(chunk, 0, 1)
            out: list[tuple[float, list[tuple[int, float]]]] = []
            try:
                L.llama_memory_seq_rm(L.llama_get_memory(ctx), 0, -1, -1)
                for at in range(0, len(tokens) - 1, chunk):
                    piece = tokens[at : at + chunk]
                    _fill_one_sequence(batch, piece, at)
                    ret = L.llama_decode(ctx, batch)
                    if ret != 0:
                        raise _err(f"llama_decode returned {ret} while scoring the prompt", permanent=False)
                    for j in range(len(piece)):
                        if at + j + 1 < len(tokens):
                            out.append(self._logprobs(j, tokens[at + j + 1], top, ctx))
            finally:
                L.llama_batch_free(batch)
                L.llama_memory_seq_rm(L.llama_get_memory(ctx), 0, -1, -1)
            return out

    def embed(self, tokens: list[int]) -> list[float]:
        """The pooled, L2-normalised embedding of ``tokens`` (at most ``lane_ctx``), from a
        context of its own created with embeddings on: the model's own pooling type when its
        GGUF names one, else mean pooling.

        llama.cpp outputs every token of a pooled input and keeps a logits row for each (its
        vocabulary's width: 786 MB for 4,000 tokens of SmolLM2, 2 GB for a 128k vocabulary) for
        the context's life. The context kept between requests therefore holds
        ``EMBED_KEPT_TOKENS``; a longer input gets a context of its own, freed once it is embedded
        (its creation is milliseconds beside the input's prefill)."""
        L = llama_cpp
        self._require_open()
        if not 0 < len(tokens) <= self.lane_ctx:
            raise EngineError(f"an input must hold 1 to {self.lane_ctx} tokens", permanent=False)
        kept = min(EMBED_KEPT_TOKENS, self.lane_ctx)
        with self._score_lock:
            self._require_open()  # again: close() may have run while this waited for the lock
            if self._embed_ctx is None:
                self._embed_ctx = self._embeddings_context(L.LLAMA_POOLING_TYPE_UNSPECIFIED, kept)
                if L.llama_pooling_type(self._embed_ctx) in (L.LLAMA_POOLING_TYPE_NONE, L.LLAMA_POOLING_TYPE_UNSPECIFIED):
                    L.llama_free(self._embed_ctx)
                    self._embed_ctx = self._embeddings_context(L.LLAMA_POOLING_TYPE_MEAN, kept)
            pooling = L.llama_pooling_type(self._embed_ctx)
            if pooling == L.LLAMA_POOLING_TYPE_RANK:
                # a reranker's: its pooled output is a score per class, not n_embd floats (read
                # as a vector, memory past it), as llama-server refuses /v1/embeddings for it
                raise Unsupported("The model's pooling type is 'rank' (a reranker): it gives scores, not embeddings.", permanent=True)
            own = len(tokens) > kept
            ctx = self._embeddings_context(pooling, len(tokens)) if own else self._embed_ctx
            batch = L.llama_batch_init(len(tokens), 0, 1)
            try:
                L.llama_memory_seq_rm(L.llama_get_memory(ctx), 0, -1, -1)
                _fill_one_sequence(batch, tokens, 0)
                ret = L.llama_decode(ctx, batch)
                if ret != 0:
                    raise _err(f"llama_decode returned {ret} while embedding", permanent=False)
                ptr = L.llama_get_embeddings_seq(ctx, 0)
                if not ptr:
                    raise _err("the embeddings context gave no pooled embedding", permanent=False)
                vec = np.ctypeslib.as_array(ptr, shape=(L.llama_model_n_embd(self._model),)).astype(np.float64)
            finally:
                L.llama_batch_free(batch)
                if own:
                    L.llama_free(ctx)
                else:
                    L.llama_memory_seq_rm(L.llama_get_memory(ctx), 0, -1, -1)
        norm = float(np.linalg.norm(vec))
        return [float(v) for v in (vec / norm if norm > 0 else vec)]

    def _embeddings_context(self, pooling: int, n_tokens: int) -> Any:
        """A one-sequence context with embeddings on that takes ``n_tokens`` in one ubatch (a
        pooled input must fit one)."""
        L = llama_cpp
        cparams = L.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = n_tokens
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = self.n_threads
        cparams.embeddings = True
        cparams.pooling_type = pooling
        cparams.no_perf = True
        ctx = L.llama_init_from_model(self._model, cparams)
        if not ctx:
            raise _err("could not create the embeddings context", permanent=False)
        return ctx

    def _logprobs(self, index: int, token: int, top: int, ctx: Any = None) -> tuple[float, list[tuple[int, float]]]:
        """The model's log-probability of ``token`` at batch row ``index`` and the ``top`` most
        likely tokens there, from the raw logits (before penalties, biases and grammar), as
        OpenAI and vLLM report them."""
        ptr = llama_cpp.llama_get_logits_ith(self._ctx if ctx is None else ctx, index)
        return logprobs_of(np.ctypeslib.as_array(ptr, shape=(self.vocab_size,)), token, top)

    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token id (EOS, EOT, ...), computed once."""
        if self._eog_ids is None:
            is_eog, vocab = llama_cpp.llama_vocab_is_eog, self._vocab
            self._eog_ids = [t for t in range(self.vocab_size) if is_eog(vocab, t)]
        return self._eog_ids

    def check_grammar(self, grammar: str) -> str | None:
        """None if llama.cpp parses ``grammar`` (GBNF, root rule ``root``), else why not."""
        self._require_open()
        _take_log()
        smpl = llama_cpp.llama_sampler_init_grammar(self._vocab, grammar.encode("utf-8"), b"root")
        if not smpl:
            return _take_log() or "the grammar does not parse"
        llama_cpp.llama_sampler_free(smpl)
        return None

    def _build_sampler(self, sp: SamplingParams) -> tuple[Any, Any]:
        """The lane's sampler chain and, apart from it, its grammar sampler (None when free).
        A free lane whose chain is the greedy sampler alone samples without it (:meth:`forward`)."""
        L = llama_cpp
        params = L.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = L.llama_sampler_chain_init(params)
        add = L.llama_sampler_chain_add
        biases = {int(t): float(b) for t, b in sp.logit_bias if 0 <= int(t) < self.vocab_size}
        if sp.ignore_eos:
            biases.update({t: _BAN for t in self.eog_tokens()})
        if biases:
            arr = (L.llama_logit_bias * len(biases))()
            for i, (t, b) in enumerate(biases.items()):
                arr[i].token = t
                arr[i].bias = _BAN if b <= -100.0 else b
            add(chain, L.llama_sampler_init_logit_bias(self.vocab_size, len(biases), arr))
        if sp.repeat_penalty != 1.0 or sp.frequency_penalty != 0.0 or sp.presence_penalty != 0.0:
            args: tuple[Any, ...] = (
                _PENALTY_LAST_N,
                repeat_penalty_of(sp),  # floored: a tinier one overflows float32 to +inf, then NaN
                sp.frequency_penalty,
                sp.presence_penalty,
            )
            if _PENALTIES_TAKE_N_VOCAB:
                args = (self.vocab_size, *args)
            add(chain, L.llama_sampler_init_penalties(*args))
            # a penalty can lift a banned token in its window (a repeat penalty below 1 shrinks
            # the ban's negative logit towards 0, a negative one adds to it): ban it again after
            bans = [t for t, b in biases.items() if b <= -100.0]
            if bans:
                again = (L.llama_logit_bias * len(bans))()
                for i, t in enumerate(bans):
                    again[i].token = t
                    again[i].bias = _BAN
                add(chain, L.llama_sampler_init_logit_bias(self.vocab_size, len(bans), again))
        grammar = None
        if sp.grammar:
            grammar = L.llama_sampler_init_grammar(self._vocab, sp.grammar.encode("utf-8"), b"root")
            if not grammar:
                L.llama_sampler_free(chain)
                raise _err("could not build the request's grammar", permanent=True)
        if _greedy(sp):
            add(chain, L.llama_sampler_init_greedy())
            return chain, grammar
        if 0 < sp.top_k < self.vocab_size:  # a larger k keeps every token: no limit (and C's int32_t
            add(chain, L.llama_sampler_init_top_k(sp.top_k))  # would wrap 2**32 + 1 to 1: greedy)
        if sp.typical_p < 1.0:
            add(chain, L.llama_sampler_init_typical(sp.typical_p, 1))
        if sp.top_p < 1.0:
            add(chain, L.llama_sampler_init_top_p(sp.top_p, 1))
        if sp.min_p > 0.0:
            add(chain, L.llama_sampler_init_min_p(sp.min_p, 1))
        add(chain, L.llama_sampler_init_temp(sp.temperature))
        seed = seed32(sp.seed)
        add(chain, L.llama_sampler_init_dist(L.LLAMA_DEFAULT_SEED if seed is None else seed))
        return chain, grammar

    def drop_sampler(self, lane: int) -> None:
        self._logprob_lanes.pop(lane, None)
        self._mask_cost.pop(lane, None)
        self._failed.pop(lane, None)
        extra = self._extra_draws.pop(lane, 0)
        job_id = self._lane_jobs.pop(lane, None)
        if extra and job_id is not None:
            self._dropped_draws[job_id] = extra
            while len(self._dropped_draws) > _DROPPED_DRAWS_KEPT:
                self._dropped_draws.popitem(last=False)
        self._argmax_lanes.discard(lane)
        chain = self._samplers.pop(lane, None)
        if chain is not None:
            llama_cpp.llama_sampler_free(chain)
        grammar = self._grammars.pop(lane, None)
        if grammar is not None:
            llama_cpp.llama_sampler_free(grammar)

    def swap_samplers(self, a: int, b: int) -> None:
        swap_keys(self._samplers, a, b)
        swap_keys(self._grammars, a, b)
        swap_keys(self._logprob_lanes, a, b)
        swap_keys(self._mask_cost, a, b)
        swap_keys(self._extra_draws, a, b)
        swap_keys(self._lane_jobs, a, b)
        # (_failed needs no swap: forward fills it and run_tick takes it in the same step)
        if (a in self._argmax_lanes) != (b in self._argmax_lanes):
            self._argmax_lanes ^= {a, b}

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        L = llama_cpp
        for lane in list(self._samplers):
            self.drop_sampler(lane)
        if self._batch is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            L.llama_free(self._ctx)
            self._ctx = None
        with self._score_lock:  # not while a prompt is being scored on the prepare thread
            if self._score_ctx:
                L.llama_free(self._score_ctx)
                self._score_ctx = None
            if self._embed_ctx:
                L.llama_free(self._embed_ctx)
                self._embed_ctx = None
            if self._model:  # under the lock: a scoring or embedding thread makes contexts from it
                L.llama_model_free(self._model)
                self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown may have torn down ctypes already
            pass
