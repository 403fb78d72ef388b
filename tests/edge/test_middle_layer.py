"""The API in-process: the ASGI application against the real worker code and the simulated
engine (tests/edge/inproc.py). SSE framing, error envelopes, validation, disconnects, bounds."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import ApplicationCommunicator
from django.test import override_settings

from activity import writer as activity_writer
from activity.models import ActivityEntry

from .inproc import (
    JSON,
    MODEL,
    SimWorker,
    application,
    attached,
    chat_body,
    request,
    scope,
    stand_in_pool,
    writes_of_a_reader_behind,
)

pytestmark = pytest.mark.django_db(transaction=True)


async def wait_idle(worker: SimWorker, link: object, limit_s: float = 10.0) -> tuple[int, int]:
    """Poll until no lane is bound and nothing is queued (or ``limit_s``); the last reading."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        busy = worker.busy()
        if busy == (0, 0) or loop.time() > deadline:
            return busy
        await asyncio.sleep(0.02)


# -- success shapes ------------------------------------------------------------------------


async def test_a_chat_completion_comes_back_whole_and_as_a_well_framed_stream(sim: SimWorker) -> None:
    async with attached(sim):
        plain = await request("POST", "/v1/chat/completions", chat_body(max_tokens=5), JSON)
        assert plain.status == 200, plain.body
        body = plain.json()
        assert body["object"] == "chat.completion" and body["model"] == MODEL
        assert body["choices"][0]["finish_reason"] == "length" and len(body["choices"][0]["message"]["content"]) == 5
        assert body["usage"]["completion_tokens"] == 5

        streamed = await request("POST", "/v1/chat/completions", chat_body(max_tokens=5, stream=True, stream_options={"include_usage": True}), JSON)
        assert streamed.status == 200 and streamed.headers["content-type"].startswith("text/event-stream")
        data = streamed.sse_data()
        assert data[-1] == "[DONE]" and streamed.body.endswith(b"data: [DONE]\n\n")
        chunks = [json.loads(d) for d in data[:-1]]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == body["choices"][0]["message"]["content"]  # the same tokens either way
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == 5 and chunks[-1]["choices"] == []
        # as OpenAI's spec says: every other chunk carries "usage": null
        assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
        for n in (1, 2):  # without include_usage no chunk has the key; n=2's choices stream apart
            other = await request("POST", "/v1/chat/completions", chat_body(max_tokens=3, stream=True, n=n), JSON)
            assert not any("usage" in json.loads(d) for d in other.sse_data()[:-1])
        pair = await request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 3, "n": 2, "stream": True,
                                                                    "stream_options": {"include_usage": True}}).encode(), JSON)
        chunks = [json.loads(d) for d in pair.sse_data()[:-1]]
        assert {c["choices"][0]["index"] for c in chunks[:-1]} == {0, 1} and all(c["usage"] is None for c in chunks[:-1])
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


async def test_deltas_that_arrive_together_go_out_in_one_write_with_the_same_stream(sim: SimWorker) -> None:
    async with attached(sim):
        body = chat_body(max_tokens=24, stream=True, temperature=0)
        whole = (await request("POST", "/v1/chat/completions", body, JSON)).sse_data()
        writes = await writes_of_a_reader_behind(sim, body)
        data = [line[6:] for line in b"".join(writes).decode().split("\n") if line.startswith("data: ")]
        assert len(data) == len(whole) >= 24  # nothing lost or repeated ...
        assert [json.loads(d)["choices"] for d in data[:-1]] == [json.loads(d)["choices"] for d in whole[:-1]]
        assert len(writes) <= 4  # ... and 24 deltas did not take 24 writes


# -- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "sim", "messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
        (b'{"model": "sim", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}', "messages[0].content"),
        (b'{"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stop": ["\\udfff"]}', "stop[0]"),
        (b'{"model": "sim", "messages": [{"role": "user", "content": "hi"}], "user": "\\ud800"}', "user"),
    ],
    ids=["json-escape", "cesu8-bytes", "stop", "user"],
)
async def test_a_lone_surrogate_is_a_400_that_registers_no_job_and_the_next_request_is_served(sim: SimWorker, body: bytes, param: str) -> None:
    async with attached(sim) as (link, _rt):
        bad = await request("POST", "/v1/chat/completions", body, JSON)
        assert bad.status == 400 and bad.is_error_object()
        assert bad.json()["error"]["param"] == param and bad.json()["error"]["type"] == "invalid_request_error"
        assert not link.inflight and not link.open  # nothing reached the link
        ok = await request("POST", "/v1/chat/completions", chat_body(max_tokens=3), JSON)
        assert ok.status == 200, ok.body


async def test_a_request_refused_before_it_has_a_job_still_has_a_request_id_in_its_reply_and_row(sim: SimWorker) -> None:
    """A 400 named no request: no ``x-request-id``, an empty id in its activity row, and an
    empty ``request_id`` on a batch's error line. It gets one of its own, in both; an answered
    request's header names its job."""
    async with attached(sim):
        bad = await request("POST", "/v1/chat/completions", b'{"model": "sim", "messages": "no"}', JSON)
        ok = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)
        assert bad.status == 400 and ok.status == 200
        bad_id, ok_id = bad.headers.get("x-request-id", ""), ok.headers.get("x-request-id", "")
        assert len(bad_id) == 32 and len(ok_id) == 32 and bad_id != ok_id
        assert await asyncio.to_thread(activity_writer.flush)
        rows = dict(await sync_to_async(list)(ActivityEntry.objects.values_list("request_id", "status")))
        assert rows == {bad_id: 400, ok_id: 200}


async def test_a_lone_surrogate_in_a_completion_prompt_or_suffix_is_a_400(sim: SimWorker) -> None:
    async with attached(sim):
        for body, param in [(b'{"model": "sim", "prompt": "\\ud800"}', "prompt"), (b'{"model": "sim", "prompt": "a", "suffix": "\\udc00"}', "suffix")]:
            reply = await request("POST", "/v1/completions", body, JSON)
            assert reply.status == 400 and reply.json()["error"]["param"] == param


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
async def test_a_body_over_the_bound_is_413_even_when_only_its_length_says_so(sim: SimWorker) -> None:
    async with attached(sim):
        big = await request("POST", "/v1/chat/completions", chat_body("x" * 2000), JSON)
        assert big.status == 413 and big.is_error_object() and big.json()["error"]["code"] == "request_too_large"
        # a Content-Length over the bound is refused before the body arrives
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", [*JSON, (b"content-length", b"5000000")]))
        await comm.send_input({"type": "http.request", "body": b"{", "more_body": True})
        start = await comm.receive_output(5)
        assert start["status"] == 413
        await comm.send_input({"type": "http.disconnect"})
        ok = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)
        assert ok.status == 200


@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
async def test_a_body_over_the_bound_keeps_its_key_in_its_activity_row(sim: SimWorker) -> None:
    """Refused before the consumer looked at the key, its row named no key: an admin could not
    tell whose client sent it. A wrong key still names none."""
    from keys.credentials import digest_of
    from keys.snapshot import Key

    secret = "sf-test-413-0123456789"
    async with attached(sim, keys={digest_of(secret): Key(id=1, name="uploader", digest=digest_of(secret))}):
        for key in (secret, "sf-not-a-key"):
            big = await request("POST", "/v1/chat/completions", chat_body("x" * 2000), [*JSON, (b"authorization", f"Bearer {key}".encode())])
            assert big.status == 413
    assert await asyncio.to_thread(activity_writer.flush)
    rows = await sync_to_async(list)(ActivityEntry.objects.order_by("id").values_list("status", "key_name"))
    assert rows == [(413, "uploader"), (413, "")]


# -- JSON everywhere, Host and Origin --------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1", 404, "not_found"),
        ("GET", "/v1/", 404, "not_found"),
        ("POST", "/v1/audio/speech", 404, "not_found"),
        ("POST", "/v1/models", 405, "method_not_allowed"),
        ("DELETE", "/v1/models/sim", 405, "method_not_allowed"),
        ("POST", "/health", 405, "method_not_allowed"),
        ("PUT", "/slots", 405, "method_not_allowed"),
        ("POST", "/metrics", 405, "method_not_allowed"),
        ("GET", "/health/x", 404, "not_found"),
        ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
        ("PUT", "/v1/completions", 405, "method_not_allowed"),
        # a doubled slash (a base URL ending in "/" joined to "/v1"): the consumers serve
        # //v1/chat/completions, and Django's pages for the other routes were HTML
        ("GET", "//v1/models", 404, "not_found"),
        ("POST", "//v1/audio/speech", 404, "not_found"),
        ("GET", "///health", 404, "not_found"),
    ],
)
async def test_every_error_under_the_api_paths_is_an_openai_error_object(sim: SimWorker, method: str, path: str, status: int, code: str) -> None:
    async with attached(sim):
        reply = await request(method, path, b"{}", JSON)
        assert reply.status == status and reply.is_error_object(), (reply.status, reply.body[:200])
        assert reply.headers["content-type"].startswith("application/json")
        assert reply.json()["error"]["code"] == code
        if status == 405:  # Allow names the methods the path takes (RFC 9110), not the one sent
            allow = {m.strip() for m in reply.headers["allow"].split(",")}
            assert allow == ({"POST"} if "completions" in path else {"GET", "HEAD"}), reply.headers["allow"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health"])
async def test_a_host_outside_allowed_hosts_is_a_json_400(sim: SimWorker, path: str) -> None:
    async with attached(sim):
        method = "POST" if "completions" in path else "GET"
        reply = await request(method, path, chat_body(), JSON, host=b"rebound.attacker.example:8000")
        assert reply.status == 400 and reply.is_error_object()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models"])
async def test_a_second_host_or_origin_header_is_judged_with_the_first_not_instead_of_it(sim: SimWorker, path: str) -> None:
    """The consumers judged the last of repeated headers alone, so a disallowed Host (or a
    foreign Origin) followed by an allowed one was served there and refused by the Django views."""
    async with attached(sim):
        method = "POST" if "completions" in path else "GET"
        hosts = [(b"host", b"rebound.attacker.example:8000"), (b"host", b"127.0.0.1:8000")]
        reply = await request(method, path, chat_body(max_tokens=1), hosts + JSON, host=None)
        assert reply.status == 400 and reply.is_error_object() and reply.json()["error"]["code"] == "invalid_host", reply.body[:200]
        origins = [(b"origin", b"http://rebound.attacker.example"), (b"origin", b"http://127.0.0.1:8000")]
        reply = await request(method, path, chat_body(max_tokens=1), origins + JSON)
        assert reply.status == 403 and reply.json()["error"]["code"] == "origin_forbidden", reply.body[:200]
        assert (await request(method, path, chat_body(max_tokens=1), origins[1:] + JSON)).status == 200


async def test_a_browser_request_from_a_foreign_origin_is_403_and_our_own_origin_is_served(sim: SimWorker) -> None:
    async with attached(sim) as (link, _rt):
        for origin in (b"http://evil.example", b"null", b"http://127.0.0.1.evil.example:8000"):
            reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), [*JSON, (b"origin", origin)])
            assert reply.status == 403 and reply.json()["error"]["code"] == "origin_forbidden"
        assert not link.open
        for origin in (b"http://127.0.0.1:8000", b"http://localhost:3000"):
            reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), [*JSON, (b"origin", origin)])
            assert reply.status == 200, reply.body


async def test_the_django_api_views_refuse_a_foreign_origin_as_the_consumers_do(sim: SimWorker) -> None:
    """A page from another site, opened by the user of a keyless loopback server, could upload
    files, start batches and unload models: only the consumers checked Origin."""
    from batches.models import File

    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": MODEL, "messages": []}}).encode()
    parts = [b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch', b'Content-Disposition: form-data; name="file"; filename="x.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n' + line]
    upload = b"".join(b"--b\r\n" + part + b"\r\n" for part in parts) + b"--b--\r\n"
    form = [(b"content-type", b"multipart/form-data; boundary=b"), (b"content-length", str(len(upload)).encode())]
    async with attached(sim):
        for path, body, headers in (("/v1/files", upload, form), ("/v1/internal/models/sim/unload", b"", []), ("/tokenize", b'{"content": "hi"}', JSON)):
            reply = await request("POST", path, body, [*headers, (b"origin", b"http://evil.example")])
            assert reply.status == 403 and reply.json()["error"]["code"] == "origin_forbidden", (path, reply.body)
        assert not await sync_to_async(File.objects.exists)()
        reply = await request("POST", "/tokenize", b'{"content": "hi"}', [*JSON, (b"origin", b"http://127.0.0.1:8000")])
        assert reply.status == 200, reply.body


# -- priority ----------------------------------------------------------------------------------


async def test_a_400_digit_priority_is_served_and_stored(sim: SimWorker) -> None:
    async with attached(sim):
        for value in (b"9" * 400, b"-" + b"9" * 400):
            reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), [*JSON, (b"x-llamaswap-priority", value)])
            assert reply.status == 200, reply.body
        assert await asyncio.to_thread(activity_writer.flush)
        priorities = {p async for p in ActivityEntry.objects.values_list("priority", flat=True)}
        assert priorities == {1_000_000, -1_000_000}


@override_settings(SUPERFLUID_HTTP_QOS_HEADER=False, SUPERFLUID_HTTP_DEFAULT_QOS="background", SUPERFLUID_HTTP_ALLOW_BATCH_INVARIANT=True)
async def test_a_locked_down_server_ignores_the_class_header_and_may_allow_batch_invariant_lanes(sim: SimWorker) -> None:
    """serve --no-http-qos-header --http-default-qos background --http-allow-batch-invariant
    (this was an e2e test with a server of its own: the model plays no part in it)."""
    body = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 3}).encode()
    async with attached(sim):
        r = await request("POST", "/v1/completions", body, [*JSON, (b"x-superfluid-qos", b"interactive")])
        assert r.status == 200 and r.headers["x-superfluid-qos"] == "background"
        r = await request("POST", "/v1/completions", body, [*JSON, (b"x-superfluid-qos", b"nonsense")])
        assert r.status == 200  # an ignored header cannot be invalid
        r = await request("POST", "/v1/completions", body, [*JSON, (b"x-superfluid-batch-invariant", b"true")])
        assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 3, r.body


async def test_batch_invariant_requests_are_403_unless_the_server_allows_them(sim: SimWorker) -> None:
    body = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 3}).encode()
    async with attached(sim):
        r = await request("POST", "/v1/completions", body, [*JSON, (b"x-superfluid-batch-invariant", b"true")])
        assert r.status == 403 and r.json()["error"]["code"] == "batch_invariant_forbidden"


# -- disconnects and bounds ---------------------------------------------------------------------


async def open_stream(body: bytes) -> tuple[ApplicationCommunicator, int]:
    """Start a streaming request and read up to its first body chunk; (communicator, status)."""
    comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", JSON))
    await comm.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await comm.receive_output(20)
    first = await comm.receive_output(20)
    assert first["type"] == "http.response.body"
    return comm, start["status"]


@override_settings(SUPERFLUID_CLIENT_CONCURRENCY=0, SUPERFLUID_MAX_QUEUE=0)
async def test_clients_dropping_after_their_first_chunk_free_every_lane_and_keep_their_rows(slow_sim: SimWorker) -> None:
    n = 40  # bench/drop_burst.py runs the full thousand against a live server
    async with attached(slow_sim) as (link, _rt):
        streams = await asyncio.gather(*(open_stream(chat_body(f"client {i}", stream=True)) for i in range(n)))
        assert {status for _comm, status in streams} == {200}
        assert slow_sim.busy()[0] == 2  # both lanes generating for someone
        for comm, _status in streams:
            await comm.send_input({"type": "http.disconnect"})
        for comm, _status in streams:
            await comm.wait(5)  # every consumer ends (a TimeoutError here: one hangs)
        assert await wait_idle(slow_sim, link) == (0, 0)
        assert not link.inflight and not link.open
    assert await asyncio.to_thread(activity_writer.flush)
    rows = await sync_to_async(list)(ActivityEntry.objects.values_list("status", "error_code"))
    assert len(rows) == n and set(rows) == {(200, "client_disconnected")}
    # each row says how long its client waited, and when its first token went out if one did;
    # the tokens generated for a client that left count too (its key's tokens on /metrics as well)
    times = await sync_to_async(list)(ActivityEntry.objects.values_list("ttft_ms", "total_ms", "completion_tokens"))
    assert all(total is not None and total > 0 for _ttft, total, _n in times)
    assert all(ttft is None or 0 < ttft <= total for ttft, total, _n in times)
    assert all((ttft is None) == (n is None) and (n is None or n >= 1) for ttft, _total, n in times)
    assert 0 < sum(ttft is not None for ttft, _total, _n in times) < n  # the two in lanes had tokens; the rest queued


@override_settings(SUPERFLUID_CLIENT_CONCURRENCY=0)
async def test_requests_inflight_counts_a_request_of_n_choices_once(slow_sim: SimWorker) -> None:
    """superfluid_requests_inflight is "generation requests the web side holds open": a request
    with n=2 counted as two (it counted jobs)."""
    from api.metrics import link_state

    async with attached(slow_sim) as (link, _rt):
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", JSON))
        await comm.send_input({"type": "http.request", "body": chat_body("two stories", stream=True, n=2, max_tokens=200), "more_body": False})
        assert (await comm.receive_output(20))["status"] == 200
        while b'"content"' not in (await comm.receive_output(20)).get("body", b""):
            pass
        state = link_state()
        assert state is not None and len(link.inflight) == 2 and state[3] == 1
        await comm.send_input({"type": "http.disconnect"})
        await comm.wait(5)
        assert await wait_idle(slow_sim, link) == (0, 0)
        assert link_state()[3] == 0  # type: ignore[index]


@override_settings(SUPERFLUID_CLIENT_CONCURRENCY=0)
async def test_a_client_leaving_n_choices_mid_stream_keeps_its_first_token_time(slow_sim: SimWorker) -> None:
    """n > 1 goes through its own loop: its row too has the time to the first token that came."""
    async with attached(slow_sim) as (link, _rt):
        comm = ApplicationCommunicator(application(), scope("POST", "/v1/chat/completions", JSON))
        await comm.send_input({"type": "http.request", "body": chat_body("two stories", stream=True, n=2, max_tokens=200), "more_body": False})
        assert (await comm.receive_output(20))["status"] == 200
        while b'"content"' not in (await comm.receive_output(20)).get("body", b""):
            pass  # the opening chunks (roles), then the first with text
        await comm.send_input({"type": "http.disconnect"})
        await comm.wait(5)
        assert await wait_idle(slow_sim, link) == (0, 0)
    assert await asyncio.to_thread(activity_writer.flush)
    rows = await sync_to_async(list)(ActivityEntry.objects.values_list("status", "error_code", "ttft_ms", "total_ms", "completion_tokens"))
    assert len(rows) == 1 and rows[0][:2] == (200, "client_disconnected")
    assert rows[0][2] is not None and 0 < rows[0][2] <= rows[0][3]
    assert rows[0][4] is not None and rows[0][4] >= 1  # the choices' tokens so far


@override_settings(SUPERFLUID_MAX_BATCH=2, SUPERFLUID_MAX_QUEUE=4)
async def test_with_two_lanes_and_max_queue_4_twelve_requests_get_six_served_and_six_told_when_to_retry(slow_sim: SimWorker) -> None:
    async with attached(slow_sim) as (link, _rt):
        replies = await asyncio.gather(
            *(request("POST", "/v1/chat/completions", chat_body(f"long {i}", max_tokens=60), JSON, timeout_s=60) for i in range(12))
        )
        served = [r for r in replies if r.status == 200]
        refused = [r for r in replies if r.status in (429, 503)]
        assert len(served) == 6 and len(refused) == 6, [r.status for r in replies]
        for r in refused:
            assert r.is_error_object() and int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "queue_full"
        assert all(r.json()["usage"]["completion_tokens"] == 60 for r in served)
        assert await wait_idle(slow_sim, link) == (0, 0)
        again = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)
        assert again.status == 200


@override_settings(SUPERFLUID_CLIENT_CONCURRENCY=3, SUPERFLUID_MAX_QUEUE=0)
async def test_a_keyless_client_beyond_client_concurrency_gets_429_with_retry_after(slow_sim: SimWorker) -> None:
    async with attached(slow_sim):
        replies = await asyncio.gather(
            *(request("POST", "/v1/chat/completions", chat_body(f"c {i}", max_tokens=40), JSON, timeout_s=60) for i in range(5))
        )
        statuses = sorted(r.status for r in replies)
        assert statuses == [200, 200, 200, 429, 429]
        limited = [r for r in replies if r.status == 429]
        assert all(r.json()["error"]["code"] == "concurrency_limit_exceeded" and int(r.headers["retry-after"]) >= 1 for r in limited)


@override_settings(SUPERFLUID_MAX_BODY_BYTES=16 * 1024 * 1024)
async def test_a_prompt_that_cannot_fit_is_refused_before_the_worker_tokenises_it(sim: SimWorker) -> None:
    # lane_ctx 512: 800 KB of control-token text, or 20,000 messages, cannot fit whatever the tokeniser
    async with attached(sim) as (link, _rt):
        tokenised = []
        engine = link.worker.engine
        real = engine.tokenize
        engine.tokenize = lambda text, **kw: tokenised.append(len(text)) or real(text, **kw)  # type: ignore[method-assign]
        huge = await request("POST", "/v1/chat/completions", chat_body("<|im_end|>" * 80_000), JSON)
        assert huge.status == 400 and huge.json()["error"]["code"] == "context_length_exceeded"
        many = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}] * 20_000}).encode()
        reply = await request("POST", "/v1/chat/completions", many, JSON)
        assert reply.status == 400 and reply.json()["error"]["param"] == "messages"
        ids = await request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": [5] * 600}).encode(), JSON)
        assert ids.status == 400 and ids.json()["error"]["code"] == "context_length_exceeded"
        # the template renders tools, tool calls' arguments and its extra variables too: each
        # counts (7 MB of tool descriptions were tokenised before the refusal)
        tool = {"type": "function", "function": {"name": "f", "description": "d" * 40_000, "parameters": {"type": "object"}}}
        call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "a" * 40_000}}]}
        for extra in ({"tools": [tool]}, {"messages": [{"role": "user", "content": "x"}, call, {"role": "tool", "tool_call_id": "c", "content": "r"}]},
                      {"chat_template_kwargs": {"notes": "n" * 40_000}}):
            big = await request("POST", "/v1/chat/completions", chat_body("hi", **extra), JSON)
            assert big.status == 400 and big.json()["error"]["code"] == "context_length_exceeded", (list(extra), big.body[:300])
        assert tokenised == [] and not link.open  # none reached the worker
        assert (await request("POST", "/v1/chat/completions", chat_body("y" * 300, max_tokens=2), JSON)).status == 200


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_response_that_fails_mid_way_stops_its_job_and_frees_the_lane(slow_sim: SimWorker, monkeypatch: pytest.MonkeyPatch, stream: bool) -> None:
    """Any failure while the response is built (here the reply's own code raises at the fifth
    delta; a tool call the parser could not read did so) ends in a server_error for the client,
    and the job stops: it used to stop only for a client's disconnect, and otherwise ran to its
    max_tokens holding a lane for nobody."""
    from api.responses import Reply

    real_delta, real_add = Reply.delta_chunks, Reply.add
    seen = {"n": 0}

    def failing(real):  # type: ignore[no-untyped-def]
        def call(self, event):  # type: ignore[no-untyped-def]
            seen["n"] += 1
            if seen["n"] == 5:
                raise RuntimeError("a bug in the reply")
            return real(self, event)

        return call

    monkeypatch.setattr(Reply, "delta_chunks", failing(real_delta))
    monkeypatch.setattr(Reply, "delta_events", failing(Reply.delta_events))  # a stream's plain text deltas
    monkeypatch.setattr(Reply, "add", failing(real_add))
    async with attached(slow_sim) as (link, _rt):
        reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=400, stream=stream), JSON)
        if stream:
            assert reply.status == 200 and json.loads(reply.sse_data()[-2])["error"]["type"] == "server_error"
        else:
            assert reply.status == 500 and reply.json()["error"]["type"] == "server_error"
        assert await wait_idle(slow_sim, link) == (0, 0)
        assert not link.inflight and not link.open
        assert slow_sim.transport is not None and slow_sim.transport.worker is not None
        assert slow_sim.transport.worker.scheduler.counters["cancelled"] == 1  # stopped, not run to its end


async def test_a_request_of_several_choices_logs_the_first_choices_wait_and_first_token() -> None:
    """n=3 on one lane: the activity row took the last choice's timing, whose first token came
    after its two siblings had run (a review helper saw ttft 3.6 s for a first token at 0.16 s)."""
    async with attached(SimWorker(lanes=1)):
        reply = await request("POST", "/v1/chat/completions", chat_body("x", n=3, max_tokens=30), JSON, timeout_s=30)
        assert reply.status == 200
    assert await asyncio.to_thread(activity_writer.flush)
    row = await sync_to_async(ActivityEntry.objects.values("queue_wait_ms", "ttft_ms", "total_ms").get)()
    assert row["ttft_ms"] * 3 < row["total_ms"] and row["queue_wait_ms"] * 3 < row["total_ms"], row


async def test_props_gives_one_models_figures_in_every_field(sim: SimWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-server's /props: the served model, its lanes and per-lane context. With several
    models every field is one model's (?model= an id or an alias, else the first configured);
    the alias came from the model used last and the path from the first."""
    from pathlib import Path
    from types import SimpleNamespace

    from api import views
    from scheduler.models_config import ServedModel

    async with attached(sim):
        one = (await request("GET", "/props")).json()
        assert (one["model_alias"], one["total_slots"], one["default_generation_settings"]["n_ctx"]) == (MODEL, 2, 512)
        models = [ServedModel("smol", Path("/m/smol.gguf"), ("small",)), ServedModel("gemma", Path("/m/gemma.gguf"), ("g3",))]
        names = {"smol": "smol", "small": "smol", "gemma": "gemma", "g3": "gemma"}
        pool = SimpleNamespace(config=SimpleNamespace(models=models), resolve=names.get, links={},
                               setup=SimpleNamespace(lanes={"smol": 4, "gemma": 1}, ctx_sizes={"smol": 2048, "gemma": 1024}))
        monkeypatch.setattr(views, "get_pool", lambda: pool)
        for query, expected in (("", ("smol", "/m/smol.gguf", 4, 2048)), ("?model=g3", ("gemma", "/m/gemma.gguf", 1, 1024))):
            props = (await request("GET", "/props" + query)).json()
            assert (props["model_alias"], props["model_path"], props["total_slots"], props["default_generation_settings"]["n_ctx"]) == expected
        missing = await request("GET", "/props?model=nope")
        assert missing.status == 404 and missing.json()["error"]["code"] == "model_not_found"


# -- several models: the router counts a lane per choice -------------------------------------


async def test_a_request_with_several_choices_asks_the_model_router_for_a_lane_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """With several models the router hands out a model's lanes: a completion of two prompts
    with n=3 runs six jobs at the worker, so it asks for six (it asked for one, and the router
    sent more work than the model had lanes). The stand-in pool answers that the model is
    unavailable once it has seen the ask: a 503, nothing submitted."""
    from scheduler.link.pool import ModelUnavailable

    asked: list[dict[str, object]] = []

    async def acquire(model: str, _priority: int, jobs: int) -> None:
        asked.append({"model": model, "jobs": jobs})
        raise ModelUnavailable(model, "The stand-in pool serves nothing.")

    stand_in_pool(monkeypatch, acquire)
    async with attached(SimWorker()):
        body = json.dumps({"model": MODEL, "prompt": ["one", "two"], "n": 3, "max_tokens": 2}).encode()
        many = await request("POST", "/v1/completions", body, JSON)
        one = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)
        # embeddings of several inputs are one job at the worker (it asked for a lane per input)
        embeddings = await request("POST", "/v1/embeddings", embeddings_body(["one", "two", "three"]), JSON)
    assert (many.status, one.status, embeddings.status) == (503, 503, 503), (many.body, one.body, embeddings.body)
    assert asked == [{"model": MODEL, "jobs": 6}, {"model": MODEL, "jobs": 1}, {"model": MODEL, "jobs": 1}]


# -- embeddings: one job, inputs that may fill the context -----------------------------------


def embedding_engine(link: object) -> list[int]:
    """The simulated engine made to embed (it has no embeddings of its own): each vector is
    (tokens, 1.0); the token counts it was given come back in the list returned."""
    engine = link.worker.engine  # type: ignore[attr-defined]
    seen: list[int] = []
    engine.features = frozenset({"embeddings"})
    engine.embed = lambda tokens: seen.append(len(tokens)) or [float(len(tokens)), 1.0]
    return seen


def embeddings_body(value: object) -> bytes:
    return json.dumps({"model": MODEL, "input": value}).encode()


@override_settings(SUPERFLUID_MAX_BODY_BYTES=16_000)
async def test_embeddings_of_32_inputs_are_one_job_and_not_bounded_as_n_copies_of_the_body(sim: SimWorker) -> None:
    """The bound on n times the prompts (each job carries the whole body) was applied to
    embeddings: 32 inputs in a body over 1/16 of --max-body-bytes were 413 naming `n`, though
    they go to the worker as one job holding each input once."""
    async with attached(sim) as (link, _rt):
        seen = embedding_engine(link)
        body = embeddings_body([f"{i:03d} " + "x" * 396 for i in range(32)])
        assert 16_000 * 2 / 32 < len(body) <= 16_000
        reply = await request("POST", "/v1/embeddings", body, JSON)
        assert reply.status == 200, reply.body[:300]
        data = reply.json()["data"]
        assert [d["index"] for d in data] == list(range(32)) and seen == [400] * 32
        assert reply.json()["usage"]["prompt_tokens"] == 32 * 400
        # choices still are bounded: 16 jobs each carrying this body's size
        many = await request("POST", "/v1/chat/completions", chat_body(n=16, max_tokens=1, user="u" * 2100), JSON)
        assert many.status == 413 and many.json()["error"]["param"] == "n"


async def test_an_embeddings_input_may_fill_the_context_and_one_too_long_is_400_naming_input(sim: SimWorker) -> None:
    """lane_ctx 512: the worker embeds an input of 512 tokens (an embedding generates nothing),
    but the web refused it as a prompt leaving no room for a token, naming `prompt`; an input
    too long must name `input`, as the worker's own refusal does."""
    async with attached(sim) as (link, _rt):
        seen = embedding_engine(link)
        for value in ([7] * 512, "z" * 512, ["a", [7] * 512]):
            reply = await request("POST", "/v1/embeddings", embeddings_body(value), JSON)
            assert reply.status == 200, (reply.body[:300], value if isinstance(value, str) else len(value))
        assert seen == [512, 512, 1, 512]
        # too long: refused by the web (token ids, or more characters than any tokeniser packs)
        # or by the worker (tokenised); every one names `input`
        for value in ([7] * 513, ["a", [7] * 513], "z" * (512 * 64 + 1), "z" * 513, ["a", "z" * 513]):
            reply = await request("POST", "/v1/embeddings", embeddings_body(value), JSON)
            assert reply.status == 400 and reply.is_error_object(), reply.body[:300]
            error = reply.json()["error"]
            assert (error["code"], error["param"], error["type"]) == ("context_length_exceeded", "input", "invalid_request_error"), error
        assert seen == [512, 512, 1, 512]  # nothing embedded for a refused request, not even its "a"
        # a completion's prompt of 512 tokens leaves no room for one: still refused, naming `prompt`
        for prompt in ([7] * 512, "z" * 512):
            reply = await request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": prompt}).encode(), JSON)
            assert reply.status == 400 and reply.json()["error"]["code"] == "context_length_exceeded", reply.body[:300]
            assert reply.json()["error"]["param"] == "prompt"
        ok = await request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": [7] * 511, "max_tokens": 1}).encode(), JSON)
        assert ok.status == 200, ok.body[:300]


# -- completions take chat's max_completion_tokens, metadata, store, service_tier ------------------


async def test_a_completion_honours_max_completion_tokens_and_takes_metadata_store_service_tier_silently(sim: SimWorker) -> None:
    """docs/api.md lists max_completion_tokens for both endpoints: on completions it was ignored
    (the reply ran to the end of the context) and named in x-superfluid-ignored-params, and so
    were metadata, store and service_tier, which chat accepts silently."""
    extra = {"metadata": {"k": "v"}, "store": False, "service_tier": "auto"}
    async with attached(sim):
        for path, body in (("/v1/completions", {"prompt": "once"}), ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
            payload = {"model": MODEL, **body, "max_completion_tokens": 3, **extra}
            reply = await request("POST", path, json.dumps(payload).encode(), JSON)
            assert reply.status == 200, (path, reply.body[:300])
            assert "x-superfluid-ignored-params" not in reply.headers, (path, reply.headers)
            assert reply.json()["usage"]["completion_tokens"] == 3 and reply.json()["choices"][0]["finish_reason"] == "length"
            clash = await request("POST", path, json.dumps({**payload, "max_tokens": 4}).encode(), JSON)
            assert clash.status == 400 and clash.is_error_object(), clash.body[:300]
            assert (clash.json()["error"]["param"], clash.json()["error"]["code"]) == ("max_completion_tokens", "invalid_value")
