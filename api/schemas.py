"""Parsing and validation of OpenAI-compatible request bodies.

Pure functions: bytes in, a :class:`GenerationRequest` out, or an :class:`~api.errors.ApiError`
naming the offending parameter (``param``) exactly as OpenAI would. Nothing here touches the
network, the ORM or the engines; tokenisation, chat templating and context-length checks happen
downstream.

Conventions, following OpenAI's API:

* A JSON ``null`` for an optional parameter means "absent" (SDKs send ``null`` for unset fields).
* Booleans are not numbers, and integers must be JSON integers (``5.0`` is not an integer).
* Parameters that llama-server or vLLM take are accepted; those that mean something here are
  honoured (``ignore_eos``, ``repetition_penalty``, ``typical_p``, ``logit_bias``, ``grammar``,
  ``json_schema``, ...). Anything else is ignored and listed in ``GenerationRequest.ignored``
  (the response names it in ``x-superfluid-ignored-params``), unless ``strict=True``
  (``--strict-params``): then it is a 400 ``unknown_parameter``, as OpenAI answers.
* A parameter we know is still checked for its type: a wrong type is a 400 in either mode.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from scheduler.core.types import SamplingParams, seed32
from superfluid_site.serving import REASONING_FORMAT_VALUES

from .errors import ApiError, invalid_request, model_not_found

Endpoint = Literal["chat", "completions", "embeddings"]

INVALID_JSON_MESSAGE = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
    "your HTTP library correctly. The API expects a JSON payload, but what was sent was not "
    "valid JSON.)"
)

# "function": a legacy function's result (``functions``/``function_call``), read as a tool result
CHAT_ROLES = frozenset({"system", "user", "assistant", "developer", "tool", "function"})
MAX_STOP_SEQUENCES = 16
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024  # entries in one logit_bias
MAX_N = 16  # choices per prompt (``n``)
MAX_PROMPTS = 32  # prompts in one completions request
MAX_CHOICES = 32  # ``n`` times the number of prompts: the jobs one request may submit
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_FLOAT_MAX = sys.float_info.max
# What an absent sampling parameter means is the scheduler's default (one place says it).
_SAMPLING = SamplingParams()
# llama-server's native routes (/completion, /infill): an absent sampling parameter is
# llama-server's default (common/common.h: common_params_sampling), which its clients (llama.vim,
# scripts, llama.cpp's examples) leave out and count on; the OpenAI routes keep OpenAI's
LLAMA_SERVER_SAMPLING: dict[str, Any] = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}

# Keys each endpoint understands. Anything else is ``unknown_parameter``.
_COMMON_KEYS = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repeat_penalty",
        "stop",
        "n",
        "stream",
        "stream_options",
        "user",
        "logit_bias",
        "cache_prompt",
        # llama-server / vLLM extensions that are honoured
        "ignore_eos",
        "repetition_penalty",
        "typical_p",
        "n_predict",
        "grammar",
        "json_schema",
        "guided_json",
        "response_format",
    }
)
# OpenAI parameters that change nothing here, accepted without naming them in ``ignored`` but
# type-checked (a 400 when of the wrong type): on both endpoints, and on chat only (the
# replacements for its deprecated ``user``, their cache hints, and a predicted output: a speed-up
# that leaves the reply as it is)
_SILENT_KEYS: dict[str, type] = {"metadata": dict, "store": bool, "service_tier": str}
_CHAT_SILENT_KEYS: dict[str, type] = {
    "prompt_cache_key": str,
    "safety_identifier": str,
    "prompt_cache_retention": str,
    "prompt_cache_options": dict,
    "prediction": dict,
}
_CHAT_KEYS = _COMMON_KEYS | frozenset(_SILENT_KEYS) | frozenset(_CHAT_SILENT_KEYS) | {
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "reasoning_effort",
    "reasoning_format",
    "modalities",
    "audio",
}
# OpenAI's completions endpoint takes ``max_completion_tokens`` as chat does (docs/api.md)
_COMPLETION_KEYS = _COMMON_KEYS | frozenset(_SILENT_KEYS) | {"prompt", "suffix", "echo", "best_of", "logprobs", "max_completion_tokens"}

# Per-message keys accepted in chat ``messages``; ``name``/``refusal``/``tool_call_id`` are
# accepted and dropped (chat templates here only see role and content), and so are the SDK's
# ``audio`` and ``annotations`` of a reply sent back as it came (``audio`` named when not null).
_MESSAGE_KEYS = frozenset(
    {"role", "content", "name", "refusal", "tool_call_id", "tool_calls", "function_call", "audio", "annotations",
     "reasoning_content", "thinking"}
)  # fmt: skip
_STREAM_OPTIONS_KEYS = frozenset({"include_usage", "include_obfuscation"})
# vLLM's (usage on every chunk): taken, as vLLM's parameters are, but not honoured
_VLLM_STREAM_OPTIONS_KEYS = frozenset({"continuous_usage_stats"})


# ---------------------------------------------------------------------------------------------
# The parsed request
# ---------------------------------------------------------------------------------------------


@dataclass
class GenerationRequest:
    """A validated generation request, endpoint-independent.

    Exactly one of ``messages`` (chat; normalised to ``[{"role", "content": str}]`` with
    ``developer`` mapped to ``system``) and ``prompt`` (completions; text or token ids) is set.
    ``max_tokens`` is ``None`` when the client did not give one: the caller picks the limit
    (typically what is left of the context window). ``stop`` is always a list.
    """

    endpoint: Endpoint
    model: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    suffix: str | None = None
    max_tokens: int | None = None
    temperature: float = _SAMPLING.temperature
    top_p: float = _SAMPLING.top_p
    top_k: int = _SAMPLING.top_k
    min_p: float = _SAMPLING.min_p
    seed: int | None = _SAMPLING.seed
    presence_penalty: float = _SAMPLING.presence_penalty
    frequency_penalty: float = _SAMPLING.frequency_penalty
    repeat_penalty: float = _SAMPLING.repeat_penalty
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    user: str | None = None
    # -- llama-server / vLLM extensions and structured output (all optional) -----------------
    logit_bias: list[list[float]] = field(default_factory=list)  # [[token id, bias], ...]
    ignore_eos: bool = _SAMPLING.ignore_eos
    typical_p: float = _SAMPLING.typical_p
    # None: no logprobs; k >= 0: the chosen token's logprob plus the top k alternatives
    logprobs: int | None = _SAMPLING.logprobs
    # {"type": "json_object"} | {"type": "json_schema", "schema": {...}, "strict": bool}
    # | {"type": "grammar", "grammar": "<GBNF>"}; None for free text
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None  # [{"name", "description", "parameters"}, ...]
    tool_choice: str | dict[str, Any] = "auto"  # "none" | "auto" | "required" | {"name": ...}
    parallel_tool_calls: bool = True
    # the tools came as the legacy ``functions``: the reply is a ``function_call`` (one at most)
    legacy_functions: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    n: int = 1  # choices per prompt
    # completions: every prompt when the request holds several (``prompt`` is then the first)
    prompts: list[str | list[int]] | None = None
    echo: bool = False  # completions: the prompt's text comes back before the completion
    # POST /infill (llama-server's): the text typed on the current line, after the prefix, and
    # the context chunks before the FIM prompt as [filename, text] pairs; None on other routes
    fim_prompt: str | None = None
    fim_extra: list[list[str]] | None = None
    # POST /infill (llama-server's; 0: off): a generated line after a new line indented by fewer
    # spaces and tabs ends the text at its first other character; the text ends at a new line
    # once this many milliseconds have passed since the first generated token
    n_indent: int = 0
    t_max_predict_ms: int = 0
    # chat: llama-server's per-request reasoning_format ("none": the reply's reasoning stays in
    # content; "auto"/"deepseek": reasoning_content); None: the server's --reasoning-format
    reasoning_format: str | None = None
    # max_tokens is a cap, which a prompt that leaves less of the context lowers to what is left
    # (Anthropic's /v1/messages: Claude Code asks 32,000 of any model, as llama-server's
    # n_predict is bounded by the context), not a demand refused where it cannot fit
    max_tokens_is_cap: bool = False
    # chat: the last message is an assistant turn the reply continues (llama-server's assistant
    # prefill, on unless --no-prefill-assistant): the prompt ends with its text, no end of turn
    prefill: bool = False
    ignored: list[str] = field(default_factory=list)  # parameters accepted but not honoured

    def sampling_dict(self) -> dict[str, Any]:
        """The sampling fields, keyed exactly like ``scheduler.core.types.SamplingParams`` so that
        ``SamplingParams(**req.sampling_dict())`` works."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "seed": self.seed,
            "repeat_penalty": self.repeat_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "typical_p": self.typical_p,
            "ignore_eos": self.ignore_eos,
            "logit_bias": tuple((int(t), float(b)) for t, b in self.logit_bias),
            "logprobs": self.logprobs,
        }

    def to_wire(self) -> dict[str, Any]:
        """All fields as a JSON-serialisable dict (a link ``Submit``'s ``request``). Lists are copied
        so the result shares no mutable state with the request."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.messages is not None:
            out["messages"] = [dict(m) for m in self.messages]
        if isinstance(self.prompt, list):
            out["prompt"] = list(self.prompt)
        out["stop"] = list(self.stop)
        out["logit_bias"] = [list(p) for p in self.logit_bias]
        out["ignored"] = list(self.ignored)
        if self.prompts is not None:
            out["prompts"] = [list(p) if isinstance(p, list) else p for p in self.prompts]
        if self.fim_extra is not None:
            out["fim_extra"] = [list(c) for c in self.fim_extra]
        # /infill's limits go only where they are set: every other request's wire form (and
        # its resume digest) stays as it was
        for key in (*_INFILL_LIMITS, "reasoning_format", "max_tokens_is_cap", "prefill"):
            if not out[key]:
                del out[key]
        return out

    @property
    def prefill_text(self) -> str:
        """The text the reply continues (:attr:`prefill`), "" without one."""
        return str(self.messages[-1].get("content") or "") if self.prefill and self.messages else ""

    @property
    def jobs(self) -> int:
        """How many jobs the worker runs for this request: one per choice (:meth:`choices`);
        embeddings one in all, whatever their inputs (the worker embeds every input in it)."""
        if self.endpoint == "embeddings":
            return 1
        return (len(self.prompts) if self.prompts is not None else 1) * self.n

    def choices(self) -> list[GenerationRequest]:
        """One single-choice request per choice, in OpenAI's ``index`` order: prompt by prompt,
        ``n`` choices each (index = prompt * n + j). With a ``seed``, choice j samples with
        ``seed + j`` (passing over a seed read as random): the same request gives the same
        choices, and they differ from each other.
        A seed that both engines read as "random" (``-1``: its low 32 bits all ones, llama.cpp's
        LLAMA_DEFAULT_SEED) leaves every choice random, not only the first."""
        prompts: list[Any] = list(self.prompts) if self.prompts is not None else [self.prompt]
        out: list[GenerationRequest] = []
        random = self.seed is not None and seed32(self.seed) is None
        for prompt in prompts:
            seed = None if random else self.seed
            for j in range(self.n):
                # the next seed for each choice after the first, passing over one whose low 32
                # bits are all ones (seed 4294967294's second choice): that one would be random
                while seed is not None and j and seed32(seed := (seed + 1 - _INT64_MIN) % 2**64 + _INT64_MIN) is None:
                    pass
                out.append(dataclasses.replace(
                    self, n=1, prompts=None, prompt=list(prompt) if isinstance(prompt, list) else prompt, seed=seed,
                    messages=[dict(m) for m in self.messages] if self.messages is not None else None,
                ))
        return out


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def parse_chat_request(raw: bytes, *, models: Collection[str], strict: bool = False, prefill: bool = False) -> GenerationRequest:
    """Validate a ``POST /v1/chat/completions`` body and return the request.

    ``raw`` is the HTTP body; ``models`` the model ids being served. Raises :class:`ApiError`
    (400 with the exact ``param``, or 404 ``model_not_found``) on the first problem found, checked
    in this order: JSON, object, ``model``, unknown keys, ``messages``, then the other parameters.
    """
    return chat_request_from(load_object(raw), models=models, strict=strict, prefill=prefill)


def chat_request_from(body: dict[str, Any], *, models: Collection[str], strict: bool = False, prefill: bool = False) -> GenerationRequest:
    """:func:`parse_chat_request` of a body already read (llama-server's /apply-template).
    ``prefill``: a last assistant turn is one the reply continues (:func:`prefilled`)."""
    model = _parse_model(body, models)
    ignored = _unknown_keys(body, _CHAT_KEYS, strict)
    messages = _parse_messages(body, strict, ignored)
    _check_silently_accepted(body, {**_SILENT_KEYS, **_CHAT_SILENT_KEYS})
    req = GenerationRequest(
        endpoint="chat",
        model=model,
        messages=messages,
        max_tokens=_parse_max_tokens(body),
        prefill=prefill and prefilled(messages),
        ignored=ignored,
    )
    _parse_common(body, req, strict)
    _parse_chat_logprobs(body, req)
    _parse_tools(body, req)
    _parse_modalities(body)
    kwargs = _optional(body, "chat_template_kwargs", dict)
    # reasoning_effort is a template variable (gpt-oss's template reads it, as vLLM and
    # llama-server pass it); chat_template_kwargs' own value wins
    effort = _optional(body, "reasoning_effort", str)
    if effort is not None:
        kwargs = {"reasoning_effort": effort, **(kwargs or {})}
    req.chat_template_kwargs = kwargs or None
    req.reasoning_format = _optional(body, "reasoning_format", str)
    if req.reasoning_format is not None and req.reasoning_format not in REASONING_FORMAT_VALUES:
        raise _invalid_value("reasoning_format", "one of " + ", ".join(f"'{v}'" for v in REASONING_FORMAT_VALUES))
    return req


def parse_completion_request(raw: bytes, *, models: Collection[str], strict: bool = False) -> GenerationRequest:
    """Validate a ``POST /v1/completions`` body and return the request.

    Same contract as :func:`parse_chat_request`. ``prompt`` may be a string, a list of token
    ids, or a list of strings or of token-id lists (several prompts: ``prompts``, one choice
    each times ``n``). ``suffix`` is kept for fill-in-the-middle; ``echo`` prepends the prompt's
    text; ``best_of`` > 1 is unsupported; ``logprobs`` (0-20) asks for that many alternatives
    per token.
    """
    body = load_object(raw)
    model = _parse_model(body, models)
    ignored = _unknown_keys(body, _COMPLETION_KEYS, strict)
    prompts = _parse_prompt(body)
    suffix = _optional(body, "suffix", str)
    echo = _optional(body, "echo", bool)
    _must_be(body, "best_of", lambda v: _is_int(v) and v == 1, "1 (best_of is not supported)")
    _check_silently_accepted(body, _SILENT_KEYS)
    req = GenerationRequest(
        endpoint="completions",
        model=model,
        prompt=prompts[0],
        prompts=prompts if len(prompts) > 1 else None,
        echo=bool(echo),
        suffix=suffix,
        # 0 as OpenAI's legacy endpoint takes it: nothing generated (echo + logprobs scores the
        # prompt alone); a fill-in-the-middle completion has nothing to give without its middle
        max_tokens=_parse_max_tokens(body, least=1 if suffix is not None else 0),
        ignored=ignored,
    )
    _parse_common(body, req, strict)
    req.logprobs = _opt_int(
        body, "logprobs", 0, MAX_TOP_LOGPROBS, f"an integer between 0 and {MAX_TOP_LOGPROBS}"
    )
    if len(prompts) * req.n > MAX_CHOICES:
        raise invalid_request(
            f"Invalid value for 'n': {len(prompts)} prompts times n={req.n} asks for "
            f"{len(prompts) * req.n} choices; at most {MAX_CHOICES} are allowed in one request.",
            param="n",
            code="invalid_value",
        )
    return req


# llama-server's /infill: its own fields, and llama-server sampling options accepted but not
# honoured here (named in the ignored-parameters header, as unknown keys are)
_INFILL_LIMITS = ("n_indent", "t_max_predict_ms")  # honoured: integers >= 0, 0 is off
_INFILL_OWN_KEYS = frozenset({"input_prefix", "input_suffix", "input_extra", "prompt", "response_fields", *_INFILL_LIMITS})
_INFILL_UNHONOURED = frozenset(
    {"samplers", "t_max_prompt_ms", "n_probs", "id_slot", "n_keep", "return_tokens", "timings_per_token", "repeat_last_n"}
)
# max_completion_tokens: read as on /completion (_native_n_predict), so never "ignored"
_INFILL_KEYS = _COMMON_KEYS | {"max_completion_tokens", "n_cmpl"} | _INFILL_OWN_KEYS | _INFILL_UNHONOURED
MAX_INFILL_CHUNKS = 1024  # input_extra entries in one request


def _native_body(raw: bytes, models: Collection[str], strict: bool, known: frozenset[str], unhonoured: frozenset[str]) -> tuple[dict[str, Any], str, list[str]]:
    """(body, model, ignored keys) of a llama-server route's body: its ``model`` may be left out
    (the first model served); llama-server's options this server does not honour (``unhonoured``)
    are accepted and named ignored beside the unknown ones (``known``: the route's keys)."""
    body = load_object(raw)
    if named_model(body) is None and models:
        body = {**body, "model": next(iter(models))}
    model = _parse_model(body, models)
    return body, model, _unknown_keys(body, known, strict) + [key for key in body if key in unhonoured]


def parse_infill_request(raw: bytes, *, models: Collection[str], strict: bool = False) -> tuple[GenerationRequest, list[str] | None]:
    """parse_infill's request and its ``response_fields``."""
    req, options = parse_infill(raw, models=models, strict=strict)
    return req, options.response_fields


def parse_infill(raw: bytes, *, models: Collection[str], strict: bool = False) -> tuple[GenerationRequest, NativeOptions]:
    """Validate a llama-server ``POST /infill`` body: the request (a fill-in-the-middle
    completion: ``input_prefix`` as the prompt, ``input_suffix`` as the suffix, ``prompt`` the
    text typed after the prefix, ``input_extra`` the context chunks) and its ``response_fields``
    (None: every field). ``model`` may be left out: the first model served (a ``--fim-model``
    takes the request, as for any FIM request). ``n`` is not an /infill parameter (one completion).
    ``n_indent`` and ``t_max_predict_ms`` (integers >= 0; 0 or absent: off) are honoured as
    llama-server honours them (``GenerationRequest``). llama-server's sampler options this server
    does not have (``samplers``, ``t_max_prompt_ms``, ...) are accepted and named in
    ``ignored``; other unknown keys as on ``/v1/completions``. Its NativeOptions: the
    ``response_fields`` and the ``n_predict`` its ``generation_settings`` echo (as /completion's)."""
    body, model, ignored = _native_body(raw, models, strict, _INFILL_KEYS, _INFILL_UNHONOURED)
    n_predict, echoed = _native_n_predict(body)
    prefix = _optional(body, "input_prefix", str)
    suffix = _optional(body, "input_suffix", str)
    typed = _optional(body, "prompt", str)
    req = GenerationRequest(
        endpoint="completions",
        model=model,
        prompt=prefix or "",
        suffix=suffix or "",  # never None: always a FIM prompt (its class, its --fim-model)
        fim_prompt=typed or None,
        fim_extra=_parse_input_extra(body),
        max_tokens=n_predict,  # as /completion's: llama-server's n_predict and its aliases
        ignored=ignored,
        **LLAMA_SERVER_SAMPLING,
    )
    _parse_native_common(body, req, strict)
    req.n = _native_n_cmpl(body, 1)
    return req, NativeOptions(response_fields=_response_fields(body), n_predict=echoed)


def _native_n_cmpl(body: Mapping[str, Any], n_prompts: int) -> int:
    """llama-server's ``n_cmpl`` (its alias ``n`` read where it is absent): completions per
    prompt, the results prompt by prompt (index prompt * n_cmpl + j), as /v1/completions' n."""
    name = "n_cmpl" if body.get("n_cmpl") is not None else "n"
    n = _opt_int(body, name, 1, MAX_N, f"an integer between 1 and {MAX_N}") or 1
    if n_prompts * n > MAX_CHOICES:
        raise _invalid_value(name, f"at most {MAX_CHOICES} completions in all ({n_prompts} prompts times {n})")
    return n


def _parse_native_common(body: dict[str, Any], req: GenerationRequest, strict: bool) -> None:
    """What llama-server's native routes (/infill, /completion) read alike: ``n_indent`` and
    ``t_max_predict_ms`` (integers >= 0; 0 or absent: off), then the common sampling fields;
    ``n`` is not read (one completion a prompt)."""
    at_least_0 = "an integer greater than or equal to 0"
    req.n_indent = _opt_int(body, "n_indent", 0, None, at_least_0) or 0
    req.t_max_predict_ms = _opt_int(body, "t_max_predict_ms", 0, None, at_least_0) or 0
    _parse_common({k: v for k, v in body.items() if k != "n"}, req, strict)


# llama-server's POST /completion (and /completions): its native completion. Its sampler options
# this server does not have are accepted and named in the ignored-parameters header, as on /infill.
_NATIVE_UNHONOURED = _INFILL_UNHONOURED | frozenset(
    {
        "dynatemp_range", "dynatemp_exponent", "mirostat", "mirostat_tau", "mirostat_eta", "top_n_sigma",
        "xtc_probability", "xtc_threshold", "dry_multiplier", "dry_base", "dry_allowed_length",
        "dry_penalty_last_n", "dry_sequence_breakers", "min_keep", "post_sampling_probs", "n_discard",
        "penalize_nl", "lora", "image_data", "return_progress",
    }
)  # fmt: skip
_NATIVE_UNHONOURED -= {"n_probs", "return_tokens"}  # honoured on /completion
_NATIVE_KEYS = _COMMON_KEYS | {"max_completion_tokens", "prompt", "response_fields", "n_probs", "logprobs", "return_tokens", "n_cmpl", *_INFILL_LIMITS} | _NATIVE_UNHONOURED


@dataclass
class NativeOptions:
    """What a /completion body asks of its response: ``response_fields`` (None: every field),
    ``return_tokens`` (the generated token ids in ``tokens``), ``probabilities`` (n_probs > 0:
    ``completion_probabilities``), ``n_predict`` (the limit its ``generation_settings`` echo where
    it is not the one the completion runs with: 0, which runs one token, as llama-server's)."""

    response_fields: list[str] | None = None
    return_tokens: bool = False
    probabilities: bool = False
    n_predict: int | None = None


def parse_native_completion_request(
    raw: bytes,
    *,
    models: Collection[str],
    strict: bool = False,
    tokenize: Callable[[str, str, bool], list[int]] | None = None,
    lane_ctx: Callable[[str], int] | None = None,
    tokenize_text: Callable[[str, str], list[int]] | None = None,
) -> tuple[GenerationRequest, NativeOptions]:
    """Validate a llama-server ``POST /completion`` body: the request (a completion of
    ``prompt``: a string, an array of token ids, an array mixing strings and token ids (one
    prompt: its strings tokenised by ``tokenize(model, text, first)``, ``first`` true for a
    string that begins it, which takes the BOS, as llama-server's ``tokenize_mixed``), or an
    array of those, each a prompt of its own) and what it asks of its response (NativeOptions). ``model`` may be left out: the first model
    served. ``n_cmpl`` (else ``n``) completions per prompt, as llama-server's; ``n_indent`` and ``t_max_predict_ms``
    are honoured as on /infill; llama-server's sampler options this server does not have are
    accepted and named in ``ignored``, other unknown keys as on ``/v1/completions``.
    ``lane_ctx(model)``: the context a prompt must fit (0: unknown); a mixed prompt is tokenised
    only as far as it may still fit. ``tokenize_text(model, text)``: a ``logit_bias`` of text's
    tokens (:func:`_text_biases`)."""
    body, model, ignored = _native_body(raw, models, strict, _NATIVE_KEYS, _NATIVE_UNHONOURED)
    body = _with_text_biases(body, model, tokenize_text)
    if tokenize is not None:
        limit = (lane_ctx(model) if lane_ctx is not None else 0) or 1 << 30
        body = {**body, "prompt": _mixed_tokenised(body.get("prompt"), lambda text, first: tokenize(model, text, first), limit)}
    prompts = _parse_prompt(body)
    n_predict, echoed = _native_n_predict(body)
    req = GenerationRequest(
        endpoint="completions",
        model=model,
        prompt=prompts[0],
        prompts=prompts if len(prompts) > 1 else None,
        max_tokens=n_predict,
        ignored=ignored,
        **LLAMA_SERVER_SAMPLING,
    )
    _parse_native_common(body, req, strict)
    # llama-server's n_probs: the top n tokens' logprobs for each generated token; return_tokens:
    # the generated tokens' ids, which come from the worker with the logprobs' entries (0 alternatives)
    # (its alias logprobs read where it is absent, a boolean as llama-server's JSON reads it: 1, 0)
    name = "n_probs" if body.get("n_probs") is not None else "logprobs"
    given = {name: int(body[name]) if isinstance(body.get(name), bool) else body.get(name)}
    n_probs = _opt_int(given, name, 0, MAX_TOP_LOGPROBS, f"an integer between 0 and {MAX_TOP_LOGPROBS}")
    return_tokens = bool(_optional(body, "return_tokens", bool))
    req.logprobs = n_probs or (0 if return_tokens else None)
    req.n = _native_n_cmpl(body, len(prompts))
    return req, NativeOptions(_response_fields(body), return_tokens, bool(n_probs), echoed)


# llama-server's hard limit on n_predict and its aliases (its server-schema.cpp: -1..INT32_MAX,
# a 400 beyond)
INT32_MAX = 2**31 - 1


def _native_n_predict(body: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """``/completion``'s limit, as llama-server reads it: ``n_predict``, else its aliases
    ``max_completion_tokens`` and ``max_tokens`` (integers from -1 to INT32_MAX, as its schema's
    hard limits: a 400 naming the field beyond; both given must agree, as on the OpenAI routes). Negative: none but the context;
    0: one token, as llama-server samples one before it checks the limit, and the 0 is what
    its ``generation_settings`` echo. Returns the limit run with and the one to echo where it
    differs (NativeOptions.n_predict)."""
    aliased = _parse_max_tokens(body, least=-1, most=INT32_MAX)
    n_predict = _opt_int(body, "n_predict", -1, INT32_MAX, f"an integer between -1 and {INT32_MAX}")
    given = n_predict if n_predict is not None else aliased
    if given is None or given < 0:
        return None, None
    return max(1, given), (0 if given == 0 else None)


def _is_mixed(value: Any) -> bool:
    """llama-server's ``json_is_array_of_mixed_numbers_strings``: strings and token ids together."""
    return isinstance(value, list) and any(isinstance(v, str) for v in value) and any(_is_int(v) for v in value)


# No tokeniser packs more characters into one token than this on average over a whole prompt
# (English text averages about 4): a prompt with more characters than lane_ctx times this cannot
# fit, and is refused before anything tokenises it (api/edge.py's check_prompt_size; a mixed
# prompt's strings here)
MAX_CHARS_PER_TOKEN = 64


def _mixed_tokenised(prompt: Any, tokenize: Callable[[str, bool], list[int]], limit: int = 1 << 30) -> Any:
    """``prompt`` with each array mixing strings and token ids (the prompt itself, or a prompt
    among several) made the token ids it stands for; anything else as it is (checked after).

    Tokenised only as far as it may fit ``limit`` tokens (this runs before the request is
    admitted, so before any rate limit): its strings' text when they alone are longer than can
    fit, its tokens as far as the ``limit``-th when there are more, which the prompt's size check
    then refuses (400 context_length_exceeded), as it refuses such a prompt given as text or ids;
    an empty string past the first is no tokens, and no call."""

    def tokens(mixed: list[Any]) -> Any:
        if not all(isinstance(v, str) or _is_int(v) for v in mixed):
            return mixed  # (refused by the prompt's check, naming it)
        if sum(len(v) for v in mixed if isinstance(v, str)) > limit * MAX_CHARS_PER_TOKEN:
            return "".join(v for v in mixed if isinstance(v, str))
        out: list[int] = []
        for i, v in enumerate(mixed):
            if isinstance(v, str):
                if v or i == 0:  # (the first takes the BOS, empty or not)
                    out += tokenize(v, i == 0)
            else:
                out.append(v)
            if len(out) >= limit:
                return out
        return out

    if _is_mixed(prompt):
        return tokens(prompt)
    if isinstance(prompt, list) and len(prompt) <= MAX_PROMPTS and any(_is_mixed(p) for p in prompt):
        return [tokens(p) if _is_mixed(p) else p for p in prompt]
    return prompt


# response_fields' paths in one request: a result object has fewer than a hundred values to pick;
# each path is looked up in every result (a prompt's, each frame's end), on the event loop, so
# two million of them in one body, times 32 prompts, stalled every other request for a minute
MAX_RESPONSE_FIELDS = 256


def _response_fields(body: Mapping[str, Any]) -> list[str] | None:
    fields_wanted = body.get("response_fields")
    if fields_wanted is not None and not (isinstance(fields_wanted, list) and all(isinstance(f, str) for f in fields_wanted)):
        raise _invalid_type("response_fields", "an array of strings")
    if fields_wanted is not None and len(fields_wanted) > MAX_RESPONSE_FIELDS:
        raise _invalid_value("response_fields", f"at most {MAX_RESPONSE_FIELDS} paths (got {len(fields_wanted)})")
    return fields_wanted


def _parse_input_extra(body: Mapping[str, Any]) -> list[list[str]]:
    """``input_extra``: ``[{"filename": str, "text": str}, ...]`` as [filename, text] pairs; a
    chunk without a file name is llama-server's ``tmp``."""
    chunks = body.get("input_extra")
    expected = 'an array of {"filename": string, "text": string} objects'
    if chunks is None:
        return []
    if not isinstance(chunks, list):
        raise _invalid_type("input_extra", expected)
    if len(chunks) > MAX_INFILL_CHUNKS:
        raise _invalid_value("input_extra", f"{expected}, at most {MAX_INFILL_CHUNKS}")
    out: list[list[str]] = []
    for i, chunk in enumerate(chunks):
        where = f"input_extra[{i}]"
        if not isinstance(chunk, dict):
            raise _invalid_type(where, 'an object {"filename": string, "text": string}')
        text = chunk.get("text")
        if not isinstance(text, str):
            raise _missing(f"{where}.text") if text is None else _invalid_type(f"{where}.text", "a string")
        filename = _optional(chunk, "filename", str, f"{where}.filename")
        out.append([filename if filename is not None else "tmp", text])
    return out


# ---------------------------------------------------------------------------------------------
# Body-level helpers
# ---------------------------------------------------------------------------------------------


def _reject_nonfinite(token: str) -> float:
    raise ValueError(f"non-standard JSON constant {token}")


def _finite_float(text: str) -> float:
    # Python's json accepts 1e999 and turns it into inf; JSON has no infinities.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text}")
    return value


def json_value(text: str) -> Any:
    """JSON as the API reads it; ValueError for anything else. parse_constant/parse_float
    reject NaN/Infinity literals and overflowing floats, which Python's json would otherwise
    accept though they are not JSON; nesting too deep for the parser is not JSON either."""
    try:
        return json.loads(text, parse_constant=_reject_nonfinite, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def load_object(raw: bytes) -> dict[str, Any]:
    """A request body: a JSON object of UTF-8 text, finite numbers and encodable strings, else
    400 (never a 500, however deep or odd)."""
    # The body is decoded as UTF-8 here, not by json.loads, which would also take UTF-16/32.
    # "surrogatepass" lets surrogates encoded as bytes (CESU-8, ``\xed\xa0\x80``) through so
    # that check_encodable() names the parameter holding them, as it does for ``"\ud800"``.
    # a byte-order mark first (editors on Windows write one) is skipped, as llama-server does
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        text = raw.decode("utf-8", errors="surrogatepass")
    except UnicodeDecodeError as exc:
        raise invalid_request(
            f"{INVALID_JSON_MESSAGE} The body is not valid UTF-8 (at byte {exc.start}).", code="invalid_json"
        ) from None
    try:
        body = json_value(text)
    except ValueError:
        raise invalid_request(INVALID_JSON_MESSAGE, code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid_request(
            "The request body must be a JSON object.", code="invalid_type"
        )
    check_encodable(body)
    return body


def check_encodable(body: Any) -> None:
    """Every string in ``body`` (values and keys, at any depth) must be encodable as UTF-8:
    a lone surrogate (``"\ud800"`` in JSON) is a 400 naming the parameter that holds it, before
    any field is read, so nothing downstream (the link, the tokeniser, the log) ever sees one."""
    stack: list[tuple[str | None, Any]] = [(None, body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            _encodable(value, path)
        elif isinstance(value, dict):
            for key in value:
                _encodable(key, path, is_key=True)
            # pushed in reverse so that the first offending parameter in the body is named
            stack.extend((f"{path}.{key}" if path else key, item) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", value[i]) for i in reversed(range(len(value))))


def _encodable(text: str, path: str | None, *, is_key: bool = False) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = f"a key of '{path}'" if is_key and path else "a key" if is_key else f"'{path}'"
        raise invalid_request(
            f"Invalid value for {where}: strings must be valid Unicode text, and this one holds "
            f"a lone surrogate (U+{ord(text[exc.start]):04X}) at character {exc.start}.",
            param=path,
            code="invalid_value",
        ) from None


def named_model(body: Mapping[str, Any]) -> Any:
    """The body's ``model`` as sent, None where it names none: absent, null or "" (an empty name
    is no name, as OpenAI answers both). Where the model is optional (/infill, /tokenize) none
    means the default; where it is required, 400 ``missing_required_parameter``."""
    model = body.get("model")
    return None if model == "" else model


def _parse_model(body: Mapping[str, Any], models: Collection[str]) -> str:
    model = named_model(body)
    if model is None:
        raise invalid_request(
            "You must provide a model parameter.", param="model", code="missing_required_parameter"
        )
    if not isinstance(model, str):
        raise _invalid_type("model", "a string")
    if model not in models:
        raise model_not_found(model)
    return model


def _unknown_keys(body: Mapping[str, Any], allowed: frozenset[str], strict: bool) -> list[str]:
    """The keys of ``body`` this endpoint does not know, in body order; with ``strict`` the first
    one is a 400 ``unknown_parameter`` instead."""
    unknown = [key for key in body if key not in allowed]
    if strict and unknown:
        key = unknown[0]
        raise invalid_request(
            f"Unrecognized request argument supplied: {key}",
            param=key,
            code="unknown_parameter",
        )
    return unknown


# ---------------------------------------------------------------------------------------------
# Chat messages
# ---------------------------------------------------------------------------------------------


def _parse_messages(body: Mapping[str, Any], strict: bool = False, ignored: list[str] | None = None) -> list[dict[str, Any]]:
    """The chat's messages, normalised. A key a message may not have is ignored and named once
    in ``ignored`` as ``messages.key`` (clients send their own: CodeCompanion an ``id``, others
    ``reasoning_content`` or ``audio: null``, all of which OpenAI accepts); with ``strict`` it is
    a 400 ``unknown_parameter`` naming the message."""
    messages = body.get("messages")
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array of message objects")
    if not messages:
        raise invalid_request(
            "Invalid value for 'messages': expected a non-empty array.",
            param="messages",
            code="invalid_value",
        )
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        msg = _parse_message(m, i, strict)
        for key in msg.pop("unknown_keys", ()):
            if ignored is not None and f"messages.{key}" not in ignored:
                ignored.append(f"messages.{key}")
        if msg.pop("legacy_result", False):
            # a legacy function result answers the call of its name that the assistant turn
            # before it made (a legacy turn has one call: call_0)
            calls = next((x.get("tool_calls") or [] for x in reversed(out) if x["role"] == "assistant"), [])
            named = [c for c in calls if c["function"]["name"] == msg["name"]] or calls
            msg["tool_call_id"] = named[0]["id"] if named else "call_0"
        out.append(msg)
    return out


def prefilled(messages: list[dict[str, Any]]) -> bool:
    """Whether the last of a chat's (parsed) messages is a prefill, as llama-server reads one:
    an assistant turn, here one without tool calls (a turn of calls is a turn; llama-server
    would continue its text and drop its calls). The turn before it may not be the assistant's
    too (llama-server's 400, its words)."""
    last = messages[-1]
    if last["role"] != "assistant" or last.get("tool_calls"):
        return False
    if len(messages) > 1 and messages[-2]["role"] == "assistant":
        raise invalid_request("Cannot have 2 or more assistant messages at the end of the list.", param="messages", code="invalid_value")
    return True


def _parse_message(msg: Any, i: int, strict: bool = False) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise _invalid_type(where, "an object")
    unknown = [key for key in msg if key not in _MESSAGE_KEYS]
    # an earlier reply's reasoning is read on an assistant message only: on another it is
    # ignored, so it is named as any key not honoured is (a 400 with ``strict``)
    role = msg.get("role")
    if isinstance(role, str) and role in CHAT_ROLES and role != "assistant":
        unknown += [key for key in ("reasoning_content", "thinking") if msg.get(key) is not None]
    elif role == "assistant" and isinstance(msg.get("thinking"), str) and msg.get("reasoning_content") and msg["thinking"] not in ("", msg["reasoning_content"]):
        # both, and they differ: reasoning_content is read (_parse_known_message), so thinking
        # is not honoured (the same text twice is read either way)
        unknown.append("thinking")
    if strict and unknown:
        raise invalid_request(
            f"Unrecognized request argument supplied: {where}.{unknown[0]}",
            param=f"{where}.{unknown[0]}",
            code="unknown_parameter",
        )
    out = _parse_known_message(msg, where)
    audio = _optional(msg, "audio", dict, f"{where}.audio")
    if audio is not None:  # an earlier spoken reply (its id at OpenAI): nothing to read here
        unknown.append("audio")
    if msg.get("annotations") is not None and not isinstance(msg["annotations"], list):
        raise _invalid_type(f"{where}.annotations", "an array")
    if unknown:
        out["unknown_keys"] = unknown
    return out


def _parse_known_message(msg: dict[str, Any], where: str) -> dict[str, Any]:
    role = msg.get("role")
    if role is None:
        raise _missing(f"{where}.role")
    if not isinstance(role, str) or role not in CHAT_ROLES:
        raise _invalid_value(
            f"{where}.role", "one of 'system', 'user', 'assistant', 'developer', 'tool', 'function'"
        )
    for key in ("name", "refusal", "tool_call_id"):
        if msg.get(key) is not None and not isinstance(msg[key], str):
            raise _invalid_type(f"{where}.{key}", "a string")
    if role == "function":
        # the legacy API's function result, named as OpenAI requires: a tool result for the call
        # the assistant turn before made (its ``function_call``; _parse_messages pairs them)
        _parse_message_tool_calls(msg, role, where)  # no calls on it
        if not msg.get("name"):
            raise _missing(f"{where}.name")
        if "content" not in msg:
            raise _missing(f"{where}.content")
        content = parse_content(msg["content"] if msg["content"] is not None else "", role, f"{where}.content")
        return {"role": "tool", "content": content, "name": msg["name"], "legacy_result": True}
    calls = _parse_message_tool_calls(msg, role, where)
    content = parse_content(msg.get("content"), "assistant" if calls else role, f"{where}.content")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
    if calls:
        out["tool_calls"] = calls
    # an earlier reply's reasoning, as it came (llama-server's reasoning_content; gpt-oss's own
    # name, thinking): the template reads it (Qwen 3's writes the last turns', gpt-oss's a
    # turn of calls' as its analysis); another role's is ignored (and named: _parse_message)
    for key in ("reasoning_content", "thinking"):
        if msg.get(key) is not None and not isinstance(msg[key], str):
            raise _invalid_type(f"{where}.{key}", "a string")
        if role == "assistant" and msg.get(key) and "reasoning_content" not in out:
            out["reasoning_content"] = msg[key]
    if role == "tool" and msg.get("tool_call_id") is not None:
        out["tool_call_id"] = msg["tool_call_id"]
    if role == "tool" and msg.get("name") is not None:
        out["name"] = msg["name"]
    return out


def _parse_message_tool_calls(msg: Mapping[str, Any], role: str, where: str) -> list[dict[str, Any]]:
    """An assistant turn's earlier tool calls (``tool_calls``, or the legacy ``function_call``),
    normalised to ``[{"id", "type": "function", "function": {"name", "arguments": str}}]``."""
    calls = msg.get("tool_calls")
    legacy = msg.get("function_call")
    if not calls and not legacy:
        return []  # empty/null values are what SDKs echo back and are harmless
    key = "tool_calls" if calls else "function_call"
    if role != "assistant":
        raise _invalid_value(f"{where}.{key}", "no tool calls on a message whose role is not 'assistant'")
    if legacy and not calls:
        calls = [{"id": "call_0", "type": "function", "function": legacy}]
    if not isinstance(calls, list):
        raise _invalid_type(f"{where}.tool_calls", "an array of tool calls")
    out = []
    for j, cw, call in _each_object(calls, f"{where}.tool_calls", "a tool call object"):
        if call.get("type") not in (None, "function"):
            raise _invalid_value(f"{cw}.type", "'function' (custom tool calls are not supported)")
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise _missing(f"{cw}.function")
        name, arguments = fn.get("name"), fn.get("arguments", "{}")
        if not isinstance(name, str) or not name:
            raise _invalid_type(f"{cw}.function.name", "a non-empty string")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments)
        if not isinstance(arguments, str):
            raise _invalid_type(f"{cw}.function.arguments", "a string of JSON")
        call_id = call.get("id") or f"call_{j}"
        if not isinstance(call_id, str):
            raise _invalid_type(f"{cw}.id", "a string")
        out.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    return out


def _each_object(items: list[Any], where: str, what: str) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(index, path, item) for each item of the array at ``where``, which must hold objects: a
    non-object is ``what`` expected at its path."""
    for j, item in enumerate(items):
        path = f"{where}[{j}]"
        if not isinstance(item, dict):
            raise _invalid_type(path, what)
        yield j, path, item


# A part the model cannot read (an image, a file), as the agent APIs put it in its place in the
# prompt: the model is told something was there that it was not shown. One place says it.
OMITTED_PART = "[{} omitted: this model reads text only]"
# A stand-in's maker: (the part, its path) -> the text in its place; it raises for a part that is
# not a well-formed one of its kind
StandIn = Callable[[dict[str, Any], str], str]


def omitted_part(kind: str) -> str:
    """The text in a prompt where a part of ``kind`` (``image``, ``file``, ``document``) was."""
    return OMITTED_PART.format(kind)


def parse_content(
    content: Any, role: str, where: str, kinds: Collection[str] = ("text",), *, empty_ok: bool = False, stand_ins: Mapping[str, StandIn] | None = None
) -> str:
    """A message's content (a string or an array of parts) as its text: the text parts (of the
    part ``kinds`` the route names text, and an assistant's refusal parts) joined one a line; a
    part this server cannot read (an image, a file, audio) is a 400 naming the content, unless
    ``stand_ins`` has its type (the agent APIs' images: :func:`omitted_part` in its place)."""
    if isinstance(content, str):
        return content
    if content is None:
        # Only assistant turns may be content-less (OpenAI allows it when tool_calls carry the
        # turn; here it is just an empty reply).
        if role == "assistant":
            return ""
        raise _missing(where)
    if not isinstance(content, list):
        raise _invalid_type(where, "a string or an array of content parts")
    if not content and not empty_ok:
        raise _invalid_value(where, "a string or a non-empty array of content parts")
    texts: list[str] = []
    for _, part_where, part in _each_object(content, where, "a content part object"):
        kind = part.get("type")
        if not isinstance(kind, str):
            raise _missing(f"{part_where}.type")
        if kind == "refusal" and role == "assistant":
            # an assistant turn's refusal part (OpenAI's assistant content is text or refusal
            # parts): what the assistant said, read as its text
            refusal = part.get("refusal")
            if not isinstance(refusal, str):
                raise _invalid_type(f"{part_where}.refusal", "a string")
            texts.append(refusal)
            continue
        if stand_ins and kind in stand_ins:
            texts.append(stand_ins[kind](part, part_where))
            continue
        if kind not in kinds:
            # param names the message's content rather than the part: the whole message is
            # what the client must change (the part index is in the message text).
            raise invalid_request(
                f"Content parts of type '{kind}' are not supported (in '{part_where}'); only "
                + " and ".join(f"'{k}'" for k in kinds) + " parts are.",
                param=where,
                code="unsupported_content",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise _invalid_type(f"{part_where}.text", "a string")
        texts.append(text)
    # one part a line, as llama.cpp's server and vLLM join text parts: an editor that sends a
    # file and a question as two parts must not have the file's last line run into the question
    return "\n".join(texts)


def _check_silently_accepted(body: Mapping[str, Any], kinds: Mapping[str, type]) -> None:
    """The silently accepted keys (``_SILENT_KEYS``, ``_CHAT_SILENT_KEYS``): ignored without
    naming them, but still a 400 when of the wrong type."""
    for key, kind in kinds.items():
        _optional(body, key, kind)


def _parse_max_tokens(body: Mapping[str, Any], least: int = 1, most: int | None = None) -> int | None:
    """``max_tokens`` or its current name ``max_completion_tokens`` (both endpoints); both given
    must agree (400 naming ``max_completion_tokens``). ``least``: the smallest allowed (0 on
    ``/v1/completions``, as OpenAI's spec has it: the prompt alone, echoed and scored); ``most``:
    the largest (llama-server's INT32_MAX on its own routes)."""
    expected = f"an integer greater than or equal to {least}" if most is None else f"an integer between {least} and {most}"
    max_tokens = _opt_int(body, "max_tokens", least, most, expected)
    max_completion = _opt_int(body, "max_completion_tokens", least, most, expected)
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise invalid_request(
            "Invalid value for 'max_completion_tokens': it must equal 'max_tokens' when both are "
            f"given (got {max_completion} and {max_tokens}); 'max_tokens' is deprecated, send "
            "only 'max_completion_tokens'.",
            param="max_completion_tokens",
            code="invalid_value",
        )
    return max_completion if max_completion is not None else max_tokens


def _parse_chat_logprobs(body: Mapping[str, Any], req: GenerationRequest) -> None:
    wanted = _optional(body, "logprobs", bool)
    top = _opt_int(
        body, "top_logprobs", 0, MAX_TOP_LOGPROBS, f"an integer between 0 and {MAX_TOP_LOGPROBS}"
    )
    if top is not None and not wanted:
        raise invalid_request(
            "Invalid value for 'top_logprobs': 'logprobs' must be true when 'top_logprobs' is given.",
            param="top_logprobs",
            code="invalid_value",
        )
    req.logprobs = (top or 0) if wanted else None


# OpenAI's rule for a function's name: the model writes it back verbatim, so nothing the tool-call
# markup or a client's dispatch could misread (a space, a quote, a newline).
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _parse_tools(body: Mapping[str, Any], req: GenerationRequest) -> None:
    """``tools``/``tool_choice`` (or the legacy ``functions``/``function_call``). Where both
    spellings are sent, the current one is used and the legacy one named as ignored."""
    tools_key = "tools" if body.get("tools") is not None else "functions"
    # ``functions`` ignored beside ``tools``: the ``function_call`` that chooses among them goes too
    legacy_ignored = tools_key == "tools" and body.get("functions") is not None
    for current, legacy in (("tools", "functions"), ("tool_choice", "function_call")):
        if (body.get(current) is not None or legacy_ignored) and body.get(legacy) is not None and legacy not in req.ignored:
            req.ignored.append(legacy)
    raw = body.get(tools_key)
    tools: list[dict[str, Any]] = []
    if raw is not None:
        if not isinstance(raw, list):
            raise _invalid_type(tools_key, "an array of tools")
        for _, where, tool in _each_object(raw, tools_key, "a tool object"):
            if tools_key == "tools":
                if tool.get("type", "function") != "function":
                    raise _invalid_value(f"{where}.type", "'function' (custom tools are not supported)")
                fn = tool.get("function")
                where = f"{where}.function"
            else:
                fn = tool
            if not isinstance(fn, dict):
                raise _missing(where)
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                raise _invalid_type(f"{where}.name", "a non-empty string")
            if not TOOL_NAME.fullmatch(name):
                raise _invalid_value(f"{where}.name", "at most 64 letters, digits, underscores or dashes")
            params = fn.get("parameters")
            if params is None:
                params = {"type": "object", "properties": {}}
            if not isinstance(params, dict):
                raise _invalid_type(f"{where}.parameters", "a JSON Schema object")
            if params.get("type", "object") != "object":
                # a call's arguments are an object (OpenAI refuses any other schema): a forced
                # call of a "string" schema was no call, its markup the reply's content
                raise _invalid_value(f"{where}.parameters", "a JSON Schema of 'type: \"object\"'")
            description = _optional(fn, "description", str, f"{where}.description")
            tools.append({"name": name, "description": description or "", "parameters": params})
    choice_key = "tool_choice" if body.get("tool_choice") is not None or legacy_ignored else "function_call"
    choice = body.get(choice_key)
    names = {t["name"] for t in tools}
    if choice is None:
        choice = "auto"
    elif isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise _invalid_value(choice_key, "'none', 'auto', 'required' or a named function")
    elif isinstance(choice, dict) and choice_key == "tool_choice" and choice.get("type") == "allowed_tools":
        tools, choice = _allowed_tools(choice.get("allowed_tools"), tools)
    elif isinstance(choice, dict) and choice_key == "tool_choice" and choice.get("type") not in (None, "function"):
        raise _invalid_value("tool_choice.type", "'function' or 'allowed_tools' (custom tools are not supported)")
    elif isinstance(choice, dict):
        fn = choice.get("function") if choice_key == "tool_choice" else choice
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise _missing(f"{choice_key}.function.name" if choice_key == "tool_choice" else f"{choice_key}.name")
        if name not in names:
            raise invalid_request(
                f"Invalid value for '{choice_key}': no function named '{name}' in '{tools_key}'.",
                param=choice_key,
                code="invalid_value",
            )
        choice = {"name": name}
    else:
        raise _invalid_type(choice_key, "a string or an object")
    if choice != "none" and choice != "auto" and not tools:
        raise invalid_request(
            f"Invalid value for '{choice_key}': it needs 'tools'.", param=choice_key, code="invalid_value"
        )
    parallel = _optional(body, "parallel_tool_calls", bool)
    if tools and req.response_format is not None and choice != "none" and req.response_format.get("type") == "grammar":
        # json_object and json_schema join the tools (a call, or an answer in the format); a
        # GBNF grammar of the client's own cannot be joined to another
        raise invalid_request(
            "A 'grammar' and 'tools' cannot both constrain a reply; send one or set 'tool_choice' to 'none'.",
            param="grammar",
            code="invalid_value",
        )
    req.tools = tools or None
    req.tool_choice = choice
    # the legacy API's reply holds one function_call: one call at most, as parallel_tool_calls false
    req.legacy_functions = bool(tools) and tools_key == "functions"
    req.parallel_tool_calls = parallel is not False and not req.legacy_functions


def _parse_modalities(body: Mapping[str, Any]) -> None:
    """``modalities`` (``["text"]``: what every reply is) and ``audio`` (a spoken reply's voice
    and format): replies here are text, so asking for audio is a 400 naming what asked."""
    modalities = body.get("modalities")
    if modalities is not None:
        if not isinstance(modalities, list) or not all(m in ("text", "audio") for m in modalities):
            raise _invalid_type("modalities", "an array of 'text' and 'audio'")
        if "audio" in modalities:
            raise invalid_request(
                "Invalid value for 'modalities': this server generates text only; 'audio' output is not supported.",
                param="modalities",
                code="unsupported_value",
            )
    if _optional(body, "audio", dict) is not None:
        raise _unsupported_parameter("audio", "this server generates text only, not spoken replies; omit it")


def _allowed_tools(spec: Any, tools: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """OpenAI's ``tool_choice`` ``{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}``:
    (the offered tools the model may call, the ``mode``: ``auto`` or ``required``). Each allowed
    tool names an offered function (``{"type": "function", "function": {"name"}}``)."""
    where = "tool_choice.allowed_tools"
    if spec is None:
        raise _missing(where)
    if not isinstance(spec, dict):
        raise _invalid_type(where, "an object")
    mode = spec.get("mode")
    if mode is None:
        raise _missing(f"{where}.mode")
    if mode not in ("auto", "required"):
        raise _invalid_value(f"{where}.mode", "'auto' or 'required'")
    allowed = spec.get("tools")
    if allowed is None:
        raise _missing(f"{where}.tools")
    if not isinstance(allowed, list):
        raise _invalid_type(f"{where}.tools", "an array of tools")
    offered = {t["name"] for t in tools}
    names: set[str] = set()
    for _, path, item in _each_object(allowed, f"{where}.tools", "a tool object"):
        if item.get("type", "function") != "function":
            raise _invalid_value(f"{path}.type", "'function'")
        fn = item.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise _missing(f"{path}.function.name")
        if name not in offered:
            raise invalid_request(
                f"Invalid value for '{path}.function.name': no function named '{name}' in 'tools'.",
                param=f"{path}.function.name",
                code="invalid_value",
            )
        names.add(name)
    if not names:
        raise _invalid_value(f"{where}.tools", "a non-empty array of tools")
    return [t for t in tools if t["name"] in names], mode


def _parse_response_format(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``response_format`` (OpenAI and vLLM), or llama-server's top-level ``json_schema`` /
    ``grammar`` and vLLM's ``guided_json``, as one normalised constraint (None: free text)."""
    # an empty grammar is none, as llama-server reads it (SillyTavern's llama.cpp backend sends
    # its empty grammar field with every request)
    found = [k for k in ("response_format", "json_schema", "guided_json", "grammar") if body.get(k) is not None and not (k == "grammar" and body[k] == "")]
    if len(found) > 1:
        raise invalid_request(
            f"Only one of {', '.join(repr(k) for k in found)} may be given.",
            param=found[1],
            code="invalid_value",
        )
    if not found:
        return None
    key = found[0]
    value = body[key]
    if key == "grammar":
        if not isinstance(value, str) or not value.strip():
            raise _invalid_type("grammar", "a non-empty GBNF grammar string")
        return {"type": "grammar", "grammar": value}
    if key in ("json_schema", "guided_json"):
        if isinstance(value, str):
            try:
                value = json_value(value)
            except ValueError:
                raise _invalid_value(key, "a JSON Schema object") from None
            check_encodable({key: value})
        if not isinstance(value, dict):
            raise _invalid_type(key, "a JSON Schema object")
        return {"type": "json_schema", "schema": value, "strict": True}
    if not isinstance(value, dict):
        raise _invalid_type("response_format", "an object")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        # llama-server's JSON mode with a schema (llama-cpp-python's and Together's spelling too):
        # the schema constrains the reply there, so it does here
        schema = value.get("schema")
        if schema is None or schema is True or schema == {}:
            return {"type": "json_object"}
        if schema is False:
            raise _invalid_value("response_format.schema", "a JSON Schema some JSON value fits (false allows none)")
        if not isinstance(schema, dict):
            raise _invalid_type("response_format.schema", "a JSON Schema object")
        return {"type": "json_schema", "schema": schema, "strict": True}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise _missing("response_format.json_schema")
        _optional(spec, "name", str, "response_format.json_schema.name")
        schema = spec.get("schema")
        if schema is None:
            schema = {}
        if schema is False:  # the schema nothing fits: no reply could follow it
            raise _invalid_value("response_format.json_schema.schema", "a JSON Schema some JSON value fits (false allows none)")
        if not isinstance(schema, (dict, bool)):
            raise _invalid_type("response_format.json_schema.schema", "a JSON Schema object")
        strict = _optional(spec, "strict", bool, "response_format.json_schema.strict")
        # the grammar enforces the schema whether or not ``strict`` is set
        return {"type": "json_schema", "schema": schema if schema is not True else {}, "strict": bool(strict)}
    raise _invalid_value("response_format.type", "'text', 'json_object' or 'json_schema'")


# ---------------------------------------------------------------------------------------------
# Completions prompt
# ---------------------------------------------------------------------------------------------


def _parse_prompt(body: Mapping[str, Any]) -> list[str | list[int]]:
    """Every prompt of the request: a string, an array of token ids, or an array of strings or
    of token-id arrays (several prompts, at most ``MAX_PROMPTS``)."""
    prompt = body.get("prompt")
    if prompt is None:
        raise _missing("prompt")

    def too_many(n: int) -> ApiError:
        return invalid_request(
            f"Invalid value for 'prompt': at most {MAX_PROMPTS} prompts in one request (got {n}).",
            param="prompt",
            code="invalid_value",
        )

    return _texts_or_token_arrays("prompt", prompt, MAX_PROMPTS, too_many, _token_ids)


_TEXTS_OR_TOKENS = "a string, an array of strings, an array of token ids, or an array of arrays of token ids"


def _texts_or_token_arrays(
    param: str, value: Any, limit: int, too_many: Callable[[int], ApiError], token_ids: Callable[[list[Any]], list[int]]
) -> list[str | list[int]]:
    """The inputs ``value`` (not None) holds: a string, an array of token ids, or an array of at
    most ``limit`` strings or non-empty token-id arrays (``too_many(n)`` is the error for more).
    ``token_ids`` checks and copies each array of token ids, in order."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise _invalid_type(param, _TEXTS_OR_TOKENS)
    if not value:
        raise _invalid_value(param, _TEXTS_OR_TOKENS)
    if all(_is_int(t) for t in value):
        return [token_ids(value)]
    if len(value) > limit:
        raise too_many(len(value))
    out: list[str | list[int]] = []
    for i, single in enumerate(value):
        if isinstance(single, str):
            out.append(single)
        elif isinstance(single, list) and single and all(_is_int(t) for t in single):
            out.append(token_ids(single))
        else:
            raise _invalid_value(param, f"{_TEXTS_OR_TOKENS} (item {i} is neither a string nor a non-empty array of token ids)")
    return out


def _token_ids(tokens: list[Any]) -> list[int]:
    if any(t < 0 for t in tokens):
        raise _invalid_value("prompt", "token ids greater than or equal to 0")
    return list(tokens)


# ---------------------------------------------------------------------------------------------
# Parameters shared by both endpoints
# ---------------------------------------------------------------------------------------------


def _parse_common(body: Mapping[str, Any], req: GenerationRequest, strict: bool = False) -> None:
    """Fill ``req``'s sampling/streaming fields from ``body`` (defaults already in ``req``)."""
    req.temperature = _opt_number(
        body, "temperature", 0.0, 2.0, req.temperature, "a number between 0 and 2"
    )
    # 0 to 1 as OpenAI's spec has it: 0 keeps only the most probable token (clients send it for
    # a deterministic reply, as OpenAI takes it; llama.cpp's top-p keeps one token at 0)
    req.top_p = _opt_number(body, "top_p", 0.0, 1.0, req.top_p, "a number between 0 and 1")
    # vLLM spells "no top-k" -1; llama-server 0
    top_k = _opt_int(body, "top_k", -1, None, "an integer greater than or equal to -1")
    if top_k is not None:
        req.top_k = max(0, top_k)
    req.min_p = _opt_number(body, "min_p", 0.0, 1.0, req.min_p, "a number between 0 and 1")
    req.typical_p = _opt_number(
        body, "typical_p", 0.0, 1.0, req.typical_p, "a number greater than 0 and at most 1", lo_open=True
    )
    req.seed = _opt_int(body, "seed", _INT64_MIN, _INT64_MAX, "a 64-bit integer")
    req.presence_penalty = _opt_number(
        body, "presence_penalty", -2.0, 2.0, req.presence_penalty, "a number between -2 and 2"
    )
    req.frequency_penalty = _opt_number(
        body, "frequency_penalty", -2.0, 2.0, req.frequency_penalty, "a number between -2 and 2"
    )
    for name in ("repeat_penalty", "repetition_penalty"):  # llama-server's name, vLLM's name
        req.repeat_penalty = _opt_number(
            body, name, 0.0, None, req.repeat_penalty, "a number greater than 0", lo_open=True
        )
    if req.max_tokens is None:
        # llama-server's n_predict; -1 (or any negative) means "until the context is full"; 0 is
        # one token, as llama-server samples one before it checks the budget (llama.vim sends 0
        # to warm the prompt cache: it must not generate to the end of the context)
        n_predict = _opt_int(body, "n_predict", None, None, "an integer")
        if n_predict is not None and n_predict >= 0:
            req.max_tokens = max(1, n_predict)
    else:
        _opt_int(body, "n_predict", None, None, "an integer")
    ignore_eos = _optional(body, "ignore_eos", bool)
    req.ignore_eos = bool(ignore_eos)
    req.stop = _parse_stop(body)
    n = _opt_int(body, "n", 1, MAX_N, f"an integer between 1 and {MAX_N}")
    req.n = n if n is not None else 1
    stream = _optional(body, "stream", bool)
    req.stream = bool(stream)
    req.include_usage = _parse_stream_options(body, req.stream, req.ignored, strict)
    user = _optional(body, "user", str)
    req.user = user
    req.logit_bias = _parse_logit_bias(body)
    _optional(body, "cache_prompt", bool)
    req.response_format = _parse_response_format(body)


# a key of logit_bias's object form that llama-server reads as a token id (strtol reads it whole;
# an empty key too, as token 0): any other key is text (server-schema.cpp's logit_bias field)
_BIAS_ID_KEY = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+|")


def _with_text_biases(body: dict[str, Any], model: str, tokenize_text: Callable[[str, str], list[int]] | None) -> dict[str, Any]:
    if tokenize_text is None or body.get("logit_bias") is None:
        return body
    return {**body, "logit_bias": _text_biases(body["logit_bias"], lambda text: tokenize_text(model, text))}


def _text_biases(bias: Any, tokenize: Callable[[str], list[int]]) -> Any:
    """llama-server's ``logit_bias`` of text (its native /completion; not /infill, whose request
    a ``--fim-model`` of another vocabulary may run): a key of the
    object form that is no integer (``{"Hello": -100}``), or a string in the array form
    (``[["Hello", false]]``, a string of digits too), stands for every token of that text,
    tokenised without special tokens (``common_tokenize(vocab, text, false)``), each given the
    bias; the pairs become the array form, ids for texts. Anything else is left as it is (checked
    after, :func:`_parse_logit_bias`, which also bounds the entries: a text longer than they could
    hold is refused before it is tokenised)."""
    if isinstance(bias, dict):
        pairs = [(key, value, not _BIAS_ID_KEY.fullmatch(key)) for key, value in bias.items()]
    elif isinstance(bias, list) and all(isinstance(p, list) and len(p) == 2 for p in bias):
        pairs = [(p[0], p[1], isinstance(p[0], str)) for p in bias]
    else:
        return bias
    if len(pairs) > MAX_LOGIT_BIAS or not any(text for _key, _value, text in pairs):
        return bias
    if sum(len(key) for key, _value, text in pairs if text) > MAX_LOGIT_BIAS * MAX_CHARS_PER_TOKEN:
        raise _invalid_value("logit_bias", f"at most {MAX_LOGIT_BIAS} entries, its texts' tokens counted")
    out: list[list[Any]] = []
    for key, value, text in pairs:
        out += [[token, value] for token in tokenize(key)] if text else [[key, value]]
        if len(out) > MAX_LOGIT_BIAS:
            raise _invalid_value("logit_bias", f"at most {MAX_LOGIT_BIAS} entries, its texts' tokens counted")
    return out


def _parse_logit_bias(body: Mapping[str, Any]) -> list[list[float]]:
    """OpenAI's ``{"token id": bias}`` (bias -100..100; -100 bans the token) or llama-server's
    ``[[token id, bias], ...]`` (a bias of ``false`` bans). Out-of-vocabulary ids are the
    worker's to reject: it knows the vocabulary."""
    bias = body.get("logit_bias")
    if bias is None:
        return []
    expected = "an object mapping token ids to numbers between -100 and 100"
    if isinstance(bias, dict):
        pairs = list(bias.items())
    elif isinstance(bias, list) and all(isinstance(p, list) and len(p) == 2 for p in bias):
        pairs = [(p[0], p[1]) for p in bias]
    else:
        raise _invalid_type("logit_bias", expected)
    if len(pairs) > MAX_LOGIT_BIAS:
        raise _invalid_value("logit_bias", f"at most {MAX_LOGIT_BIAS} entries")
    out: list[list[float]] = []
    for key, value in pairs:
        if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 12:
            token = int(key)
        elif _is_int(key) and 0 <= key < 2**31:
            token = int(key)
        else:
            raise _invalid_value("logit_bias", f"{expected} (token id {str(key)[:20]!r})")
        if value is False:
            value = -100
        if not _is_number(value) or not -100 <= value <= 100:
            raise _invalid_value("logit_bias", expected)
        out.append([token, float(value)])
    return out


def _parse_stop(body: Mapping[str, Any]) -> list[str]:
    stop = body.get("stop")
    expected = f"a non-empty string or an array of at most {MAX_STOP_SEQUENCES} non-empty strings"
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    elif not isinstance(stop, list):
        raise _invalid_type("stop", expected)
    if len(stop) > MAX_STOP_SEQUENCES or not all(isinstance(s, str) and s for s in stop):
        raise _invalid_value("stop", expected)
    return list(stop)


def _parse_stream_options(body: Mapping[str, Any], stream: bool, ignored: list[str], strict: bool = False) -> bool:
    """``stream_options.include_usage``. vLLM's ``continuous_usage_stats`` is accepted and named in
    ``ignored`` (unknown under ``strict``); any other key is a 400 ``unknown_parameter``."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise invalid_request(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
            code="invalid_value",
        )
    if not isinstance(options, dict):
        raise _invalid_type("stream_options", "an object")
    for key, value in options.items():
        if key not in _STREAM_OPTIONS_KEYS and (strict or key not in _VLLM_STREAM_OPTIONS_KEYS):
            raise invalid_request(
                f"Unrecognized request argument supplied: stream_options.{key}",
                param=f"stream_options.{key}",
                code="unknown_parameter",
            )
        # include_obfuscation is accepted and ignored: padding only matters over untrusted hops.
        if value is not None and not isinstance(value, bool):
            raise _invalid_type(f"stream_options.{key}", "a boolean")
        if key in _VLLM_STREAM_OPTIONS_KEYS and value is not None and f"stream_options.{key}" not in ignored:
            ignored.append(f"stream_options.{key}")
    return bool(options.get("include_usage"))


# ---------------------------------------------------------------------------------------------
# Scalar validators
# ---------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    # bool is a subclass of int in Python but not an integer in JSON terms.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _opt_number(
    body: Mapping[str, Any],
    name: str,
    lo: float,
    hi: float | None,
    default: float,
    expected: str,
    *,
    lo_open: bool = False,
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value):
        raise _invalid_type(name, expected)
    too_low = value <= lo if lo_open else value < lo
    if too_low or (hi is not None and value > hi):
        raise _invalid_value(name, expected)
    # one without a bound above may be a JSON integer no float holds (10**400): float() raised,
    # a 500; it is the largest float, as 1.7e308 is taken (the engines hold it to float32's)
    return float(min(value, _FLOAT_MAX))


def _opt_int(
    body: Mapping[str, Any], name: str, lo: int | None, hi: int | None, expected: str
) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise _invalid_type(name, expected)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _invalid_value(name, expected)
    return int(value)


def _must_be(body: Mapping[str, Any], name: str, ok: Callable[[Any], bool], expected: str) -> None:
    """``body[name]`` must be absent/null or satisfy ``ok``; otherwise ``unsupported_value``."""
    value = body.get(name)
    if value is not None and not ok(value):
        raise invalid_request(
            f"Invalid value for '{name}': expected {expected}.",
            param=name,
            code="unsupported_value",
        )


_EXPECTED = {str: "a string", bool: "a boolean", dict: "an object"}


def _optional(body: Mapping[str, Any], key: str, kind: type[Any], param: str | None = None) -> Any:
    """``body[key]``, None when absent or null; a value that is not a ``kind`` is an
    ``invalid_type`` error naming ``param`` (``key`` unless given)."""
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise _invalid_type(param or key, _EXPECTED[kind])
    return value


def _missing(param: str) -> ApiError:
    return invalid_request(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _invalid_type(param: str, expected: str) -> ApiError:
    return invalid_request(
        f"Invalid value for '{param}': expected {expected}.", param=param, code="invalid_type"
    )


def _invalid_value(param: str, expected: str) -> ApiError:
    return invalid_request(
        f"Invalid value for '{param}': expected {expected}.", param=param, code="invalid_value"
    )


def _unsupported_parameter(param: str, why: str) -> ApiError:
    return invalid_request(
        f"The '{param}' parameter is not supported: {why}.",
        param=param,
        code="unsupported_parameter",
    )


# ---------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------

MAX_EMBEDDING_INPUTS = 32
_EMBEDDING_KEYS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})


def parse_embeddings_request(raw: bytes, *, models: Collection[str], strict: bool = False) -> tuple[GenerationRequest, str]:
    """Validate a ``POST /v1/embeddings`` body: (the request, with every input in ``prompts``
    and the first in ``prompt``; the ``encoding_format``, ``float`` or ``base64``). ``input`` is
    a string, an array of strings, an array of token ids or an array of token-id arrays (at most
    ``MAX_EMBEDDING_INPUTS``); ``dimensions`` is refused: the model's vectors are not truncated."""
    body = load_object(raw)
    model = _parse_model(body, models)
    ignored = _unknown_keys(body, _EMBEDDING_KEYS, strict)
    value = body.get("input")
    if value is None:
        raise _missing("input")

    def too_many(n: int) -> ApiError:
        return _invalid_value("input", f"at most {MAX_EMBEDDING_INPUTS} inputs in one request (got {n})")

    inputs = _texts_or_token_arrays("input", value, MAX_EMBEDDING_INPUTS, too_many, list)
    for item in inputs:
        if isinstance(item, str) and not item:
            raise _invalid_value("input", "non-empty strings")
        if isinstance(item, list) and any(t < 0 for t in item):
            raise _invalid_value("input", "token ids greater than or equal to 0")
    fmt = body.get("encoding_format")
    if fmt is None:
        fmt = "float"
    if fmt not in ("float", "base64"):
        raise _invalid_value("encoding_format", "'float' or 'base64'")
    if body.get("dimensions") is not None:
        raise _unsupported_parameter(
            "dimensions", "this server returns the model's own embedding size and does not shorten vectors; omit it"
        )
    user = _optional(body, "user", str)
    req = GenerationRequest(
        endpoint="embeddings",
        model=model,
        prompt=inputs[0],
        prompts=inputs,
        user=user,
        ignored=ignored,
    )
    return req, fmt
