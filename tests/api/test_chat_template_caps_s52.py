"""llama-server's /props ``chat_template_caps``: what the chat template does with a chat, found by
rendering probe conversations through it as llama.cpp's common/jinja/caps.cpp ``caps_get`` does
(scheduler/engines/template_caps.py). /props had no such field.

The expected maps in templates_s46/chat_template_caps.json are llama-server's own answers: the
vendored build (``build_info`` b1-0c1e570, /work/builds/llama_cpp_python-0.3.36) started with
``--jinja --chat-template-file <template>`` on the bundled SmolLM2 model, its ``GET /props`` read.
What they say, from caps.cpp's logic:

- ``supports_string_content``: a user message whose content is a string renders (every template
  here); ``supports_typed_content``: the content is iterated or ``selectattr``-ed as an array of
  parts (GLM 4.6/4.7, Qwen3.5: true; ChatML/Qwen2.5, Llama 3.1, Mistral Nemo, gpt-oss: false);
- ``supports_system_role``: a system message's content is read (Gemma 2 raises on it: false);
- ``supports_tools``: the tool's ``function.name`` is read (false for Gemma 2, ChatML and the
  DeepSeek R1 distill, which renders no tools); ``supports_tool_calls``: an assistant turn's
  ``tool_calls`` is read (the R1 distill does, without tools); ``supports_object_arguments``: an
  argument of an object ``arguments`` is read (not only dumped whole: every tool template here);
  ``supports_parallel_tool_calls``: the second of two calls in a turn is read (gpt-oss renders
  one call per turn: false);
- ``supports_preserve_reasoning``: an earlier turn's ``reasoning_content`` is in the text with
  ``preserve_thinking`` (GLM 4.7 Flash alone); ``supports_reasoning_effort``: ``reasoning_effort``
  is read (gpt-oss alone)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.engines.chat import CHATML, GEMMA
from scheduler.engines.sim import SimEngine
from scheduler.engines.template_caps import CAPS, chat_template_caps
from tests.api.test_props_models_meta_s48 import _never
from tests.edge.inproc import MODEL, SimWorker, attached, request

TEMPLATES = Path(__file__).parent / "templates_s46"
LLAMA_SERVER_CAPS: dict[str, dict[str, bool]] = json.loads((TEMPLATES / "chat_template_caps.json").read_text())
NONE = dict.fromkeys(CAPS, False)
# llama-server's for this server's ChatML and its built-in Gemma template (the same build, read alike)
PLAIN = {**NONE, "supports_string_content": True, "supports_system_role": True}


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


@pytest.mark.parametrize("name", sorted(LLAMA_SERVER_CAPS))
def test_caps_are_llama_servers_for_each_real_template(name: str) -> None:
    assert chat_template_caps(template(name)) == LLAMA_SERVER_CAPS[name]


def test_the_recorded_caps_cover_the_kinds_of_template_named() -> None:
    """ChatML/Qwen2.5 with tools, Llama 3.1, Mistral Nemo, gpt-oss, Gemma 2 without a system
    role, and a template without tools (the R1 distill) are among those compared."""
    qwen, gemma, oss = (LLAMA_SERVER_CAPS[n] for n in ("qwen2.5-7b-instruct", "gemma-2-2b-it", "gpt-oss-120b"))
    assert qwen["supports_tools"] and qwen["supports_parallel_tool_calls"] and not qwen["supports_typed_content"]
    assert not gemma["supports_system_role"] and not gemma["supports_tools"]
    assert oss["supports_reasoning_effort"] and not oss["supports_parallel_tool_calls"]
    assert not LLAMA_SERVER_CAPS["deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"]["supports_tools"]
    assert LLAMA_SERVER_CAPS["llama-3.1-instruct"]["supports_tools"] and LLAMA_SERVER_CAPS["mistral-nemo-instruct-2407"]["supports_tools"]


@pytest.mark.parametrize("source", [CHATML, GEMMA, None])
def test_caps_of_chatml_and_the_builtin_gemma_template(source: str | None) -> None:
    assert chat_template_caps(source) == PLAIN


HOSTILE = [
    "{{ raise_exception('no') }}",  # raises on every probe
    "{% for",  # does not compile
    "{{ messages[0].content.__class__.__mro__ }}",  # the sandbox refuses it
    "{{ 1 / 0 }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",  # recursion without end
    "{{ messages | map(attribute='content') | join | int + tools }}",
    "{{ messages[0].content | selectattr('type') | list }}",
    "{% set x = namespace(a=messages) %}{{ x.a[9].content }}",
    "{{ tools[0].function.arguments.arg }}{{ reasoning_effort.upper() }}",
    "{{ [0] * 10000000 }}",
]


@pytest.mark.parametrize("source", HOSTILE)
def test_a_hostile_template_gives_caps_not_an_error(source: str) -> None:
    caps = chat_template_caps(source)
    assert set(caps) == set(CAPS) and all(isinstance(v, bool) for v in caps.values())


def test_a_template_that_fails_every_probe_has_every_cap_false() -> None:
    """As llama.cpp's try/catch reads a probe that throws: nothing rendered, nothing supported."""
    assert chat_template_caps("{{ raise_exception('no') }}") == NONE
    assert chat_template_caps("{% for") == NONE


_pieces = st.sampled_from(
    [
        "{{ messages[0].content }}", "{% for m in messages %}{{ m.role }}{{ m['content'] }}{% endfor %}",
        "{% if tools %}{{ tools | tojson }}{% endif %}", "{{ raise_exception('x') }}", "{% if m is string %}",
        "{% endif %}", "{% for c in messages[0].content %}{{ c.text }}{% endfor %}", "{{ reasoning_effort }}",
        "{{ messages[1].tool_calls[1].function.arguments | items | list }}", "{{ 1 // 0 }}", "{{ bos_token }}",
        "{% for", "}}", "{{ messages | selectattr('role', 'equalto', 'system') | first }}", "x",
    ]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_pieces, max_size=6).map("".join) | st.text(max_size=60))
def test_any_template_gives_a_full_map_of_booleans(source: str) -> None:
    caps = chat_template_caps.__wrapped__(source)
    assert list(caps) == list(CAPS) and all(isinstance(v, bool) for v in caps.values())


# -- /props, in process ---------------------------------------------------------------------


def templated(source: str) -> type[SimWorker]:
    class Engine(SimEngine):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.chat_template = source

    return type("TemplatedWorker", (SimWorker,), {"engine_class": Engine})


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["qwen2.5-7b-instruct", "gemma-2-2b-it", "gpt-oss-120b"])
async def test_props_gives_the_caps_of_the_template_chats_are_rendered_with(name: str) -> None:
    async with attached(templated(template(name))()):
        props = (await request("GET", "/props")).json()
    assert props["chat_template"] == template(name)
    assert props["chat_template_caps"] == LLAMA_SERVER_CAPS[name]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("source", ["{{ raise_exception('no') }}", "{% for", "{{ 1 / 0 }}"])
async def test_props_of_a_model_whose_template_fails_is_still_answered(source: str) -> None:
    async with attached(templated(source)()):
        reply = await request("GET", "/props")
    assert reply.status == 200, reply.body
    assert reply.json()["chat_template_caps"] == NONE


@pytest.mark.django_db(transaction=True)
async def test_props_caps_before_the_worker_said_its_template_are_the_model_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """No hello yet: the template is read from the model's file (SmolLM2's ChatML), its caps too."""
    from api import views

    async with attached(SimWorker()):
        monkeypatch.setattr(views, "get_link", lambda: SimpleNamespace(hello=None, snapshot=None, wait_connected=_never))
        props = (await request("GET", "/props")).json()
    source, _bos, _eos = views.vocab_of(None).template_parts()
    assert props["chat_template"] == source
    assert props["chat_template_caps"] == chat_template_caps(source) == PLAIN


@pytest.mark.django_db(transaction=True)
async def test_props_caps_with_several_models_are_the_named_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """``?model=`` (an id or an alias) picks the model whose template's caps are given; without
    it, the first configured."""
    from api import views

    def hello(name: str) -> Any:
        return SimpleNamespace(hello=SimpleNamespace(chat_template=template(name), engine="llamacpp", model_ftype=None))

    class Pool:
        config = SimpleNamespace(models=[SimpleNamespace(id="first", path="first.gguf"), SimpleNamespace(id=MODEL, path="sim.gguf")])
        setup = SimpleNamespace(ctx_sizes={"first": 512, MODEL: 512}, lanes={"first": 1, MODEL: 1})
        links = {"first": hello("gemma-2-2b-it"), MODEL: hello("gpt-oss-120b")}

        def resolve(self, name: str) -> str | None:
            return {"first": "first", MODEL: MODEL, "sim-alias": MODEL}.get(name)

    monkeypatch.setattr(views, "get_pool", Pool)
    async with attached(SimWorker()):
        default = (await request("GET", "/props")).json()
        named = (await request("GET", "/props?model=sim-alias")).json()
    assert default["chat_template_caps"] == LLAMA_SERVER_CAPS["gemma-2-2b-it"]
    assert named["chat_template_caps"] == LLAMA_SERVER_CAPS["gpt-oss-120b"]


@pytest.mark.django_db(transaction=True)
async def test_props_probes_a_models_template_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probes render the template several times: a second /props reads their caps back."""
    from scheduler.engines import template_caps

    rendered: list[int] = []
    probe = template_caps._Probe.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        rendered.append(1)
        probe(self, *args, **kwargs)

    monkeypatch.setattr(template_caps._Probe, "__init__", counted)
    async with attached(templated(template("qwen3-coder") + "{# once #}")()):
        first = (await request("GET", "/props")).json()
        probes = len(rendered)
        second = (await request("GET", "/props")).json()
    assert probes and len(rendered) == probes
    assert first["chat_template_caps"] == second["chat_template_caps"] == LLAMA_SERVER_CAPS["qwen3-coder"]
