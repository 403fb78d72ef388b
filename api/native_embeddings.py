"""llama-server's native embeddings routes, ``POST /embedding`` and ``POST /embeddings``.

The same pipeline as ``POST /v1/embeddings`` (keys, admission, the worker's embeddings thread,
activity rows and metrics as endpoint ``embeddings``), in llama-server's shapes
(``handle_embeddings_impl`` with ``TASK_RESPONSE_TYPE_NONE`` in its server-context.cpp):

- the text is ``input`` or, where it is absent, ``content`` (a string, token ids, or an array of
  those, as on /v1/embeddings); ``model`` may be left out (the first model served);
- ``embd_normalize`` as llama-server's ``common_embd_normalize``: 2 (the default) Euclidean,
  0 the largest absolute value scaled to 32760 (int16's range), 1 taxicab, p > 2 the p-norm;
- the reply is a JSON array, one ``{"index", "embedding": [vector]}`` per input, in order.

llama-server gives one vector per token where the model's pooling type is ``none`` (a generative
model's): here every model is pooled (its own pooling type, else mean, as on /v1/embeddings), so
``embedding`` holds one vector. The engine hands vectors over L2-normalised, which any other
norm is a rescaling of; unnormalised vectors (``embd_normalize`` -1) cannot be had from them and
are refused, as a clear 400, not answered with normalised ones.
"""

from __future__ import annotations

import json
import math
from typing import Any

from superfluid_site.serving import serving

from .consumers import EmbeddingsConsumer
from .errors import ApiError, invalid_request
from .schemas import GenerationRequest, load_object, parse_embeddings_request

EUCLIDEAN = 2
LARGEST_NORM = 2**31 - 1  # llama-server reads embd_normalize as a C int


def parse_native_embeddings_request(raw: bytes, *, models: list[str], strict: bool = False) -> tuple[GenerationRequest, int, str]:
    """(the request, as /v1/embeddings' parser makes it, its ``embd_normalize``, the field its
    text came in: ``input`` or ``content``)."""
    body = load_object(raw)
    named = "input" if body.get("input") is not None else "content"
    value = body.get(named)
    if value is None:
        raise invalid_request(
            "Missing required parameter: 'content' (or 'input'): the text to embed.", param="content", code="missing_required_parameter"
        )
    normalize = body.get("embd_normalize", EUCLIDEAN)
    if isinstance(normalize, bool) or not isinstance(normalize, int):
        raise invalid_request("Invalid value for 'embd_normalize': expected an integer.", param="embd_normalize", code="invalid_type")
    if normalize == -1:
        raise invalid_request(
            "The 'embd_normalize' value -1 (no normalisation) is not supported: the engine gives L2-normalised vectors; "
            "use 2 (Euclidean, the default), 0 (max absolute, int16 range), 1 (taxicab) or a p-norm p > 2.",
            param="embd_normalize",
            code="unsupported_parameter",
        )
    if normalize < -1 or normalize > LARGEST_NORM:
        raise invalid_request(
            "Invalid value for 'embd_normalize': expected 0 (max absolute), 1 (taxicab), 2 (Euclidean) "
            f"or a p-norm 2 < p <= {LARGEST_NORM}.",
            param="embd_normalize",
            code="invalid_value",
        )
    oai = {k: v for k, v in body.items() if k not in ("content", "input", "embd_normalize")}
    if oai.get("model") is None and models:
        oai["model"] = models[0]  # llama-server's native routes take no model: the first served
    oai["input"] = value
    try:
        request, _fmt = parse_embeddings_request(json.dumps(oai).encode(), models=models, strict=strict)
    except ApiError as exc:
        raise in_field(exc, named) from None
    return request, normalize, named


def in_field(exc: ApiError, named: str) -> ApiError:
    """An error about the text (``input``, as /v1/embeddings' parser and the worker name it)
    named as the body sent it: ``content`` where that is the field."""
    if exc.param == "input" and named == "content":
        exc.param = "content"
        exc.message = exc.message.replace("'input'", "'content'")
    return exc


def normalized(vector: list[float], norm: int) -> list[float]:
    """``vector`` (L2-normalised) under llama-server's ``embd_normalize`` ``norm`` (>= 0)."""
    if norm == EUCLIDEAN:
        return list(vector)
    top = max((abs(v) for v in vector), default=0.0)
    if top == 0:
        return [0.0 for _ in vector]
    if norm == 0:
        scale = top / 32760.0
    else:  # the p-norm, taken over |v| / top (no overflow or underflow for a large p)
        scale = top * math.fsum((abs(v) / top) ** norm for v in vector) ** (1.0 / norm)
    return [v / scale for v in vector]


class NativeEmbeddingsConsumer(EmbeddingsConsumer):
    """``POST /embedding``, ``POST /embeddings``: llama-server's native request and reply."""

    named = "input"  # the field the text came in

    def parse(self, body: bytes, models: list[str]) -> GenerationRequest:
        request, self.embd_normalize, self.named = parse_native_embeddings_request(body, models=models, strict=serving().strict_params)
        self.encoding_format = "float"
        return request

    async def send_error(self, exc: ApiError) -> None:
        # the worker's refusals of the text (a token id outside the vocabulary, a text longer
        # than the context) name it 'input': named as the body sent it
        await super().send_error(in_field(exc, self.named))

    def embeddings_body(self, request: GenerationRequest, vectors: list[list[float]], tokens: int) -> Any:
        return [{"index": i, "embedding": [normalized(v, self.embd_normalize)]} for i, v in enumerate(vectors)]
