"""llama-server's /props ``bos_token``, ``eos_token``, ``model_ftype`` and ``chat_template`` before
the worker says it, and /v1/models' ``meta`` (``n_embd``, ``n_params``, ``size``, ``ftype``), from
the model where the worker knows them (server-context.cpp's get_res_props, get_res_model_info)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from scheduler.engines.sim import SimEngine
from tests.edge.inproc import SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)

META = {"n_embd": 576, "n_params": 134515008, "size": 96576768, "ftype": "Q4_1"}


class MetaSim(SimEngine):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_meta = dict(META)


class MetaWorker(SimWorker):
    engine_class = MetaSim


async def test_models_meta_has_llama_servers_n_embd_n_params_size_and_ftype() -> None:
    async with attached(MetaWorker()):
        models = (await request("GET", "/v1/models")).json()
        bare = (await request("GET", "/models")).json()
        one = (await request("GET", "/v1/models/sim")).json()
    meta = models["data"][0]["meta"]
    assert {k: meta[k] for k in META} == META
    assert bare["data"][0]["meta"] == meta and one["meta"] == meta


async def test_props_has_the_models_ftype_and_its_bos_and_eos_text() -> None:
    """The bundled model's file (the web process reads it, as for /tokenize): SmolLM2's BOS and
    EOS are ChatML's turn markers."""
    async with attached(MetaWorker()):
        props = (await request("GET", "/props")).json()
    assert props["model_ftype"] == "Q4_1"
    assert isinstance(props["bos_token"], str) and props["bos_token"]
    assert props["eos_token"] == "<|im_end|>"


async def test_props_chat_template_before_the_worker_said_it_is_read_from_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """No hello yet (a worker loading, a Redis fleet): chat_template was null, though the web
    process reads the same template from the model's file for /apply-template."""
    from api import views

    async with attached(SimWorker()):
        said = (await request("GET", "/props")).json()["chat_template"]
        monkeypatch.setattr(views, "get_link", lambda: SimpleNamespace(hello=None, snapshot=None, wait_connected=_never))
        props = (await request("GET", "/props")).json()
    assert said  # the simulated engine's (ChatML): not the file's
    source, _bos, _eos = views.vocab_of(None).template_parts()
    assert source and props["chat_template"] == source
    assert props["model_ftype"] is None and props["total_slots"] is None


async def _never(_timeout: float) -> bool:
    return False


async def test_models_meta_has_llama_servers_n_ctx_the_context_one_request_may_use() -> None:
    """llama-server's model object says a slot's context as ``meta.n_ctx`` (get_res_model_info),
    which clients of its /v1/models read for the window; it was left out here, where only the
    OpenAI-style ``context_length`` said it."""
    async with attached(MetaWorker(lane_ctx=1024)):
        models = (await request("GET", "/v1/models")).json()
        one = (await request("GET", "/v1/models/sim")).json()
    assert models["data"][0]["meta"]["n_ctx"] == models["data"][0]["context_length"] == 1024
    assert one["meta"]["n_ctx"] == 1024
