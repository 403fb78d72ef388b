"""Admission rules in-process, on a fixed snapshot of keys: who may ask for what, and the limits.

The same rules run end to end against a real server in ``test_e2e_keys.py``; here each rule is
checked on its own, quickly, with the settings it depends on.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from api.admission import Admission, Principal, admit, authenticate
from api.errors import ApiError
from api.schemas import GenerationRequest
from keys.credentials import digest_of
from keys.runtime import Key, KeyRuntime, Policy, Snapshot
from scheduler.core.qos import QosClass

MODEL = "m"
IP = ("10.0.0.7", 5555)


def runtime(*keys: tuple[str, Key]) -> KeyRuntime:
    """A runtime on the running loop with these (secret, key) pairs and no database watcher."""
    rt = KeyRuntime(asyncio.get_running_loop(), watch=False)
    rt.snapshot = Snapshot(version=1, keys_by_digest={k.digest: k for _, k in keys})
    rt.loaded.set()
    rt.touch = lambda key: None  # type: ignore[method-assign]
    return rt


def key(secret: str, name: str, policy: Policy | None = None, **fields: object) -> tuple[str, Key]:
    return secret, Key(id=abs(hash(name)) % 10_000, name=name, digest=digest_of(secret), policy=policy, **fields)  # type: ignore[arg-type]


def chat(**fields: object) -> GenerationRequest:
    fields.setdefault("model", MODEL)
    return GenerationRequest(endpoint="chat", messages=[{"role": "user", "content": "hi"}], **fields)  # type: ignore[arg-type]


def fim() -> GenerationRequest:
    return GenerationRequest(endpoint="completions", model=MODEL, prompt="def f(", suffix="return x")


def bearer(secret: str, **extra: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}", **extra}


async def expect(code: str, coro: object) -> ApiError:
    with pytest.raises(ApiError) as err:
        await coro  # type: ignore[misc]
    assert err.value.code == code, err.value
    return err.value


# -- authentication ----------------------------------------------------------------------


@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
async def test_a_missing_or_unknown_key_is_401_when_keys_are_required() -> None:
    rt = runtime(key("sf-good", "good"))
    err = await expect("invalid_api_key", authenticate({}, IP, rt))
    assert err.status == 401 and err.type == "authentication_error"
    await expect("invalid_api_key", authenticate(bearer("sf-bad"), IP, rt))
    principal = await authenticate({"x-api-key": "sf-good"}, IP, rt)
    assert principal.key_name == "good" and principal.client_ip == "10.0.0.7"


@override_settings(SUPERFLUID_KEYS_REQUIRED=False)
async def test_without_required_keys_an_unknown_key_is_anonymous() -> None:
    rt = runtime(key("sf-good", "good"))
    principal = await authenticate(bearer("unused"), IP, rt)  # what the openai client sends
    assert principal.key is None and principal.client_id == "ip:10.0.0.7"


@pytest.mark.parametrize("required", [True, False])
async def test_revoked_and_expired_keys_are_always_401(required: bool) -> None:
    past = timezone.now() - timedelta(seconds=1)
    rt = runtime(key("sf-rev", "rev", revoked=True), key("sf-old", "old", expires=past))
    with override_settings(SUPERFLUID_KEYS_REQUIRED=required):
        err = await expect("invalid_api_key", authenticate(bearer("sf-rev"), IP, rt))
        assert "revoked" in err.message and "sf-rev" not in err.message
        await expect("invalid_api_key", authenticate(bearer("sf-old"), IP, rt))


async def test_a_key_expiring_later_still_works() -> None:
    rt = runtime(key("sf-new", "new", expires=timezone.now() + timedelta(hours=1)))
    assert (await authenticate(bearer("sf-new"), IP, rt)).key_name == "new"


# -- class and priority ------------------------------------------------------------------

AGENT_UP_TO_COMPLETION = Policy(name="p", default_class=QosClass.AGENT, max_class=QosClass.COMPLETION)


async def test_the_keys_default_class_applies_when_the_request_names_none() -> None:
    bg = Policy(name="bg", default_class=QosClass.BACKGROUND, max_class=QosClass.BACKGROUND)
    rt = runtime(key("sf-k", "k", bg))
    admission = await admit(bearer("sf-k"), IP, chat(), runtime=rt)
    assert admission.qos is QosClass.BACKGROUND and admission.key_name == "k"


async def test_a_key_may_demote_freely_and_ask_up_to_its_best_class() -> None:
    rt = runtime(key("sf-k", "k", AGENT_UP_TO_COMPLETION))
    for asked, got in [("background", QosClass.BACKGROUND), ("agent", QosClass.AGENT), ("completion", QosClass.COMPLETION)]:
        admission = await admit(bearer("sf-k", **{"x-superfluid-qos": asked}), IP, chat(), runtime=rt)
        assert admission.qos is got


async def test_asking_above_the_best_class_by_the_qos_header_is_403() -> None:
    rt = runtime(key("sf-k", "k", AGENT_UP_TO_COMPLETION))
    err = await expect("qos_class_forbidden", admit(bearer("sf-k", **{"x-superfluid-qos": "interactive"}), IP, chat(), runtime=rt))
    assert err.status == 403 and err.type == "permission_error"
    low = await admit(bearer("sf-k", **{"x-llamaswap-priority": "batch"}), IP, chat(), runtime=rt)
    assert low.qos is QosClass.BACKGROUND


@pytest.mark.parametrize("header", ["interactive", "100", "999999", "9" * 400])
async def test_a_priority_in_a_band_above_the_best_class_is_clamped_to_the_policy_not_refused(header: str) -> None:
    # the request-priority seed: the header is never an error
    rt = runtime(key("sf-k", "k", AGENT_UP_TO_COMPLETION))
    admission = await admit(bearer("sf-k", **{"x-llamaswap-priority": header}), IP, chat(), runtime=rt)
    assert admission.qos is QosClass.COMPLETION and admission.priority == 0 and admission.band == "normal"
    bg = runtime(key("sf-b", "b", Policy(name="bg", default_class=QosClass.BACKGROUND, max_class=QosClass.BACKGROUND, priority_offset=2)))
    admission = await admit(bearer("sf-b", **{"x-llamaswap-priority": header}), IP, chat(), runtime=bg)
    assert admission.qos is QosClass.BACKGROUND and admission.priority == -98 and admission.band == "batch"


@pytest.mark.parametrize("qos", ["background", None])
async def test_a_priority_above_the_best_class_is_clamped_also_beside_the_class_header(qos: str | None) -> None:
    """A background-only key sending its own class and a huge priority: with several models the
    router orders requests and swaps by priority alone, so the number must not outrank what an
    interactive user sends (it did: the priority passed unclamped beside x-superfluid-qos)."""
    bg = runtime(key("sf-b", "b", Policy(name="bg", default_class=QosClass.BACKGROUND, max_class=QosClass.BACKGROUND, priority_offset=2)))
    headers = bearer("sf-b", **{"x-llamaswap-priority": "1000000"}, **({"x-superfluid-qos": qos} if qos else {}))
    for request in (chat(), fim()):
        admission = await admit(headers, IP, request, runtime=bg)
        assert admission.priority == -98 and admission.band == "batch", (request, admission.priority)
    rt = runtime(key("sf-k", "k", AGENT_UP_TO_COMPLETION))
    admission = await admit(bearer("sf-k", **{"x-superfluid-qos": "agent", "x-llamaswap-priority": "interactive"}), IP, chat(), runtime=rt)
    assert admission.qos is QosClass.AGENT and admission.priority == 0 and admission.band == "normal"


@pytest.mark.parametrize(("header", "priority"), [("9" * 400, 1_000_000), ("-" + "9" * 400, -1_000_000), ("9" * 5000, 1_000_000), ("-" + "9" * 5000, -1_000_000), ("1000001", 1_000_000), ("-1000000", -1_000_000), ("123", 123)])
async def test_a_priority_is_clamped_where_it_enters_so_nothing_downstream_overflows(header: str, priority: int) -> None:
    rt = runtime()
    admission = await admit({"x-llamaswap-priority": header}, IP, chat(), runtime=rt)
    assert admission.priority == priority
    assert float(admission.priority) + 0.5 < 2**31  # the worker's score and an IntegerField hold it


@override_settings(SUPERFLUID_HTTP_QOS_HEADER=False)
async def test_without_the_qos_header_the_key_default_holds_and_priority_only_orders() -> None:
    rt = runtime(key("sf-k", "k", AGENT_UP_TO_COMPLETION))
    for priority, expected in (("40", 40), ("100", 0)):  # a band above the best class: clamped
        headers = bearer("sf-k", **{"x-superfluid-qos": "interactive", "x-llamaswap-priority": priority})
        admission = await admit(headers, IP, chat(), runtime=rt)
        assert admission.qos is QosClass.AGENT and admission.priority == expected


async def test_without_a_policy_the_server_defaults_hold() -> None:
    rt = runtime(key("sf-k", "k"))
    admission = await admit(bearer("sf-k", **{"x-superfluid-qos": "interactive"}), IP, chat(), runtime=rt)
    assert admission.qos is QosClass.INTERACTIVE  # the seed's warning: lock the header down with policies


# off the anchors too: 49 + 39 and -50 + 39 crossed into the next band (the clamp looked at the header alone)
@pytest.mark.parametrize(("header", "offset", "priority", "band"), [(None, 2, 2, "normal"), ("batch", 2, -98, "batch"), ("interactive", -39, 61, "interactive"), ("-100", 39, -61, "batch"),
                                                                    ("49", 39, 49, "normal"), ("-50", 39, -50, "batch"), ("50", -39, 50, "interactive"), ("-49", -39, -49, "normal")])
async def test_the_tier_offset_is_added_to_the_priority_without_crossing_a_band(header: str | None, offset: int, priority: int, band: str) -> None:
    p = Policy(name="tier", default_class=QosClass.AGENT, max_class=QosClass.INTERACTIVE, priority_offset=offset)
    rt = runtime(key("sf-k", "k", p))
    headers = bearer("sf-k", **({"x-llamaswap-priority": header} if header else {}))
    admission = await admit(headers, IP, chat(), runtime=rt)
    assert admission.priority == priority and admission.band == band


@pytest.mark.parametrize(("header", "offset", "priority"), [(None, 2, -98), ("interactive", 0, -100), ("49", 0, -51), ("-100", 1, -99)])
async def test_a_batch_line_runs_at_background_and_in_the_batch_band(header: str | None, offset: int, priority: int) -> None:
    """A batch line runs at background whatever its key's policy; its priority moves into the
    batch band too, keeping its tier offset (it stayed in the normal band, where the several-
    models router, which orders by priority alone, ranked it with agent requests)."""
    p = Policy(name="tier", default_class=QosClass.AGENT, max_class=QosClass.INTERACTIVE, priority_offset=offset)
    rt = runtime(key("sf-k", "k", p))
    admission = await admit(bearer("sf-k", **({"x-llamaswap-priority": header} if header else {})), IP, chat(), runtime=rt, run_in=QosClass.BACKGROUND)
    assert (admission.qos, admission.priority, admission.band) == (QosClass.BACKGROUND, priority, "batch")


async def test_a_higher_priority_in_a_band_never_makes_a_batch_line_a_lower_one() -> None:
    """The offset a batch line keeps was counted from round(priority / 100) * 100, which rounds
    halves to even: a key at 50 (interactive's band) kept +50 from normal's anchor and ran at -50,
    before one at 100 (-100); one at 150 ran at -150, one at 250 at -50, one at 350 at -150.
    (Across bands the order is not kept: each band's offsets count from its own anchor.)"""
    p = Policy(name="tier", default_class=QosClass.AGENT, max_class=QosClass.INTERACTIVE)
    rt = runtime(key("sf-k", "k", p))
    for band in (range(-49, 50), range(50, 400)):
        got = []
        for header in band:
            admission = await admit(bearer("sf-k", **{"x-llamaswap-priority": str(header)}), IP, chat(), runtime=rt, run_in=QosClass.BACKGROUND)
            assert admission.band == "batch"
            got.append((header, admission.priority))
            await admission.release()
        assert all(a[1] <= b[1] for a, b in zip(got, got[1:], strict=False)), got
    assert dict(got)[50] == -150 and dict(got)[100] == -100 and dict(got)[149] == -51


async def test_each_batchs_lines_count_as_a_client_of_their_own_not_as_127_0_0_1() -> None:
    """Keys without a rate of their own fall under the per-IP --rate-limit: every batch's lines
    were 127.0.0.1, so one key's batch line made another key's a 429. Each batch is now a client
    of its own: another batch is unaffected, and its own bucket still holds."""
    from api.admission import Principal
    from batches.runner import batch_client

    p = Policy(name="p")  # no rate of its own
    pairs = key("sf-a", "alice", p), key("sf-b", "bob", p)
    rt = runtime(*pairs)
    alice, bob = (k for _, k in pairs)
    with override_settings(SUPERFLUID_RATE_LIMIT=1):
        await admit({}, ("127.0.0.1", 0), chat(), principal=Principal(key=alice, client_ip=batch_client("batch_a")), runtime=rt)
        await admit({}, ("127.0.0.1", 0), chat(), principal=Principal(key=bob, client_ip=batch_client("batch_b")), runtime=rt)
        await expect("rate_limit_exceeded", admit({}, ("127.0.0.1", 0), chat(), principal=Principal(key=alice, client_ip=batch_client("batch_a")), runtime=rt))


async def test_fill_in_the_middle_runs_as_completion_whatever_the_key_asks() -> None:
    bg = Policy(name="bg", default_class=QosClass.BACKGROUND, max_class=QosClass.BACKGROUND)
    rt = runtime(key("sf-k", "k", bg))
    admission = await admit(bearer("sf-k", **{"x-superfluid-qos": "interactive"}), IP, fim(), runtime=rt)
    assert admission.qos is QosClass.COMPLETION


# -- models and batch-invariant ------------------------------------------------------------


async def test_a_model_outside_the_policy_is_403() -> None:
    p = Policy(name="p", allowed_models=("other",))
    rt = runtime(key("sf-k", "k", p))
    err = await expect("model_forbidden", admit(bearer("sf-k"), IP, chat(), runtime=rt))
    assert err.status == 403 and err.param == "model"


async def test_with_several_models_a_listed_model_may_be_named_by_any_of_its_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request may name a model by id or alias: a policy listing the id allows its aliases and
    one listing an alias allows the id (the alias g3 of a listed gemma was a 403)."""
    from types import SimpleNamespace

    from scheduler.link import pool as pool_module

    names = {"gemma": "gemma", "g3": "gemma", "smol": "smol", "small": "smol"}
    stub = SimpleNamespace(resolve=names.get, route=lambda name, fim: names.get(name), setup=SimpleNamespace(lanes={}))
    monkeypatch.setattr(pool_module, "get_pool", lambda: stub)
    for listed, asked, allowed in (("gemma", "g3", True), ("g3", "gemma", True), ("gemma", "small", False), ("gemma", "nowhere", False)):
        rt = runtime(key("sf-k", "k", Policy(name="p", allowed_models=(listed,))))
        attempt = admit(bearer("sf-k"), IP, chat(model=asked), runtime=rt)
        if allowed:
            assert (await attempt).key_name == "k"
        else:
            await expect("model_forbidden", attempt)


async def test_batch_invariant_needs_the_policy_or_the_server_flag() -> None:
    granted = Policy(name="bi", allow_batch_invariant=True)
    rt = runtime(key("sf-plain", "plain", Policy(name="p")), key("sf-bi", "bi", granted))
    headers = {"x-superfluid-batch-invariant": "true"}
    await expect("batch_invariant_forbidden", admit(bearer("sf-plain", **headers), IP, chat(), runtime=rt))
    assert (await admit(bearer("sf-bi", **headers), IP, chat(), runtime=rt)).batch_invariant
    with override_settings(SUPERFLUID_HTTP_ALLOW_BATCH_INVARIANT=True):
        assert (await admit(bearer("sf-plain", **headers), IP, chat(), runtime=rt)).batch_invariant


# -- limits ----------------------------------------------------------------------------------


async def test_the_keys_rpm_bucket_gives_429_with_retry_after() -> None:
    rt = runtime(key("sf-k", "k", Policy(name="p", rate_limit_rpm=2)))
    for _ in range(2):
        await admit(bearer("sf-k"), IP, chat(), runtime=rt)
    err = await expect("rate_limit_exceeded", admit(bearer("sf-k"), IP, chat(), runtime=rt))
    assert err.status == 429 and err.type == "rate_limit_error" and 1 <= int(err.headers["Retry-After"]) <= 30


@override_settings(SUPERFLUID_RATE_LIMIT=2)
async def test_the_per_ip_limit_applies_without_a_key_limit_and_a_limited_key_is_exempt() -> None:
    rt = runtime(key("sf-own", "own", Policy(name="own", rate_limit_rpm=100)), key("sf-none", "none"))
    for _ in range(2):
        await admit({}, IP, chat(), runtime=rt)
    await expect("rate_limit_exceeded", admit({}, IP, chat(), runtime=rt))
    await expect("rate_limit_exceeded", admit(bearer("sf-none"), IP, chat(), runtime=rt))  # same IP, no own limit
    for _ in range(5):
        await admit(bearer("sf-own"), IP, chat(), runtime=rt)  # its own limit instead
    await admit({}, ("10.0.0.8", 1), chat(), runtime=rt)  # another address has its own bucket


async def test_concurrency_slots_are_held_until_release() -> None:
    rt = runtime(key("sf-k", "k", Policy(name="p", max_concurrent=1)))
    first: Admission = await admit(bearer("sf-k"), IP, chat(), runtime=rt)
    err = await expect("concurrency_limit_exceeded", admit(bearer("sf-k"), IP, chat(), runtime=rt))
    assert err.status == 429 and err.headers["Retry-After"] == "1"
    await first.release()
    await first.release()  # twice is harmless
    second = await admit(bearer("sf-k"), IP, chat(), runtime=rt)
    await second.release()


def set_policy(rt: KeyRuntime, secret: str, name: str, policy: Policy | None) -> None:
    """An admin edit reaching the runtime: a new snapshot with the key's new policy."""
    rt.snapshot = Snapshot(version=rt.snapshot.version + 1, keys_by_digest={digest_of(secret): key(secret, name, policy)[1]})


@pytest.mark.parametrize("before", [None, Policy(name="p", max_concurrent=0)], ids=["no-policy", "no-limit"])
async def test_a_max_concurrent_set_while_requests_run_counts_those_already_running(before: Policy | None) -> None:
    """The key's requests were counted only while a limit was set: two running when the admin
    set max_concurrent=2 were not seen, and two more were let in."""
    rt = runtime(key("sf-k", "k", before))
    running = [await admit(bearer("sf-k"), IP, chat(), runtime=rt) for _ in range(2)]
    set_policy(rt, "sf-k", "k", Policy(name="p", max_concurrent=2))
    err = await expect("concurrency_limit_exceeded", admit(bearer("sf-k"), IP, chat(), runtime=rt))
    assert err.status == 429 and int(err.headers["Retry-After"]) >= 1
    await running[0].release()
    third = await admit(bearer("sf-k"), IP, chat(), runtime=rt)  # one ended: one place free
    await expect("concurrency_limit_exceeded", admit(bearer("sf-k"), IP, chat(), runtime=rt))
    set_policy(rt, "sf-k", "k", before)  # the limit lifted: none refused, all still counted
    more = [await admit(bearer("sf-k"), IP, chat(), runtime=rt) for _ in range(3)]
    for admission in [running[1], third, *more]:
        await admission.release()
    assert rt.slots.held == {}


async def test_a_refused_request_takes_no_rate_token() -> None:
    rt = runtime(key("sf-k", "k", Policy(name="p", rate_limit_rpm=1, max_concurrent=1)))
    held = await admit(bearer("sf-k"), IP, chat(), runtime=rt)
    rt.buckets.buckets[("key", "k")].tokens = 1.0  # as if a minute had passed
    await expect("concurrency_limit_exceeded", admit(bearer("sf-k"), IP, chat(), runtime=rt))
    await held.release()
    await admit(bearer("sf-k"), IP, chat(), runtime=rt)  # the token is still there


@override_settings(SUPERFLUID_COMPLETION_RATE="1/m", SUPERFLUID_COMPLETION_BURST=2)
async def test_fill_in_the_middle_has_its_own_bucket_per_key_or_ip() -> None:
    rt = runtime(key("sf-k", "k"))
    for _ in range(2):
        await admit(bearer("sf-k"), IP, fim(), runtime=rt)
    err = await expect("completion_rate_limited", admit(bearer("sf-k"), IP, fim(), runtime=rt))
    assert err.status == 429 and int(err.headers["Retry-After"]) >= 1
    await admit(bearer("sf-k"), IP, chat(), runtime=rt)  # other requests are not counted
    for _ in range(2):  # the same address without the key is another client
        await admit({}, IP, fim(), runtime=rt)
    await expect("completion_rate_limited", admit({}, IP, fim(), runtime=rt))


@override_settings(SUPERFLUID_COMPLETION_RATE="0")
async def test_a_zero_completion_rate_turns_the_bucket_off() -> None:
    rt = runtime()
    for _ in range(30):
        await admit({}, IP, fim(), runtime=rt)


def test_a_principal_names_its_client_by_key_else_by_address() -> None:
    _, k = key("sf-k", "k")
    assert Principal(k, "1.2.3.4").client_id == "key:k"
    assert Principal(None, "1.2.3.4").client_id == "ip:1.2.3.4"


# -- bounded admission: --max-queue, --client-concurrency (issue 10) -------------------------


@override_settings(SUPERFLUID_MAX_BATCH=2, SUPERFLUID_MAX_QUEUE=4, SUPERFLUID_CLIENT_CONCURRENCY=0)
async def test_beyond_the_lanes_plus_max_queue_a_request_is_503_queue_full_until_one_ends() -> None:
    rt = runtime()
    held = [await admit({}, (f"10.0.0.{i}", 1), chat(), runtime=rt) for i in range(6)]  # 2 lanes + 4 waiting
    err = await expect("queue_full", admit({}, ("10.0.0.99", 1), chat(), runtime=rt))
    assert err.status == 503 and err.type == "server_error" and int(err.headers["Retry-After"]) >= 1
    await held.pop().release()
    held.append(await admit({}, ("10.0.0.99", 1), chat(), runtime=rt))
    for admission in held:
        await admission.release()
    assert rt.in_flight.held == {}


@override_settings(SUPERFLUID_MAX_BATCH=8, SUPERFLUID_MAX_QUEUE=2, SUPERFLUID_CLIENT_CONCURRENCY=0)
async def test_with_several_models_an_id_and_its_alias_share_one_bound_sized_by_that_models_lanes(monkeypatch: pytest.MonkeyPatch) -> None:
    import scheduler.link.pool as pool_module

    class Setup:
        lanes = {"smol": 1, "other": 8, "coder-fim": 2}

    class Pool:
        setup = Setup()

        def resolve(self, name: str) -> str | None:
            return {"smol": "smol", "s": "smol", "other": "other"}.get(name)

        def route(self, name: str, *, fim: bool) -> str | None:
            model = self.resolve(name)
            return "coder-fim" if model is not None and fim else model

    monkeypatch.setattr(pool_module, "get_pool", lambda: Pool())
    rt = runtime()
    held = [await admit({}, (f"10.0.0.{i}", 1), chat(model=m), runtime=rt) for i, m in enumerate(["smol", "s", "smol"])]  # 1 lane + 2 waiting
    await expect("queue_full", admit({}, ("10.0.0.99", 1), chat(model="s"), runtime=rt))
    assert rt.in_flight.held == {"smol": 3}
    held.append(await admit({}, ("10.0.0.98", 1), chat(model="other"), runtime=rt))  # another model's bound
    # fill-in-the-middle runs on the --fim-model: its place counts there, not against smol's
    # full queue (FIM traffic pushed chat requests into 503 queue_full)
    infill = fim()
    infill.model = "smol"
    held.append(await admit({}, ("10.0.0.97", 1), infill, runtime=rt))
    assert rt.in_flight.held == {"smol": 3, "other": 1, "coder-fim": 1}
    for admission in held:
        await admission.release()
    assert rt.in_flight.held == {}


@override_settings(SUPERFLUID_MAX_BATCH=2, SUPERFLUID_MAX_QUEUE=4, SUPERFLUID_CLIENT_CONCURRENCY=0)
async def test_the_retry_after_of_a_full_queue_follows_the_measured_drain_rate() -> None:
    from keys.limits import DrainMeter
    from scheduler.engines.sim import FakeClock

    clock = FakeClock()
    rt = runtime()
    rt.drain = DrainMeter(window_s=30.0, clock=clock)
    held = [await admit({}, IP, chat(), runtime=rt) for _ in range(6)]
    err = await expect("queue_full", admit({}, IP, chat(), runtime=rt))
    assert err.headers["Retry-After"] == "4"  # nothing has ended yet: a second per waiting request
    for _ in range(30):  # 30 requests end in 30 s, one a second, each replaced by a new one
        clock.advance(1.0)
        await held.pop(0).release()
        held.append(await admit({}, IP, chat(), runtime=rt))
    assert (await expect("queue_full", admit({}, IP, chat(), runtime=rt))).headers["Retry-After"] == "4"
    for _ in range(120):  # then four a second
        clock.advance(0.25)
        await held.pop(0).release()
        held.append(await admit({}, IP, chat(), runtime=rt))
    assert (await expect("queue_full", admit({}, IP, chat(), runtime=rt))).headers["Retry-After"] == "1"
    clock.advance(600)  # nothing ends for a long while: the rate is forgotten
    assert (await expect("queue_full", admit({}, IP, chat(), runtime=rt))).headers["Retry-After"] == "4"
    for admission in held:
        await admission.release()


@override_settings(SUPERFLUID_CLIENT_CONCURRENCY=2, SUPERFLUID_MAX_QUEUE=0)
async def test_a_keyless_client_address_has_client_concurrency_requests_in_flight_at_most() -> None:
    rt = runtime(key("sf-k", "k"))
    held = [await admit({}, IP, chat(), runtime=rt) for _ in range(2)]
    err = await expect("concurrency_limit_exceeded", admit({}, IP, chat(), runtime=rt))
    assert err.status == 429 and err.type == "rate_limit_error" and int(err.headers["Retry-After"]) >= 1
    other = await admit({}, ("10.0.0.8", 1), chat(), runtime=rt)  # another address
    keyed = [await admit(bearer("sf-k"), IP, chat(), runtime=rt) for _ in range(3)]  # a key is not a keyless client
    await held[0].release()
    held[0] = await admit({}, IP, chat(), runtime=rt)
    for admission in [*held, other, *keyed]:
        await admission.release()
    assert rt.client_slots.held == {}


# -- prefix cache: scope and pins (issue 15) ------------------------------------------------


async def test_each_policy_gets_its_own_prefix_cache_scope_unless_it_shares() -> None:
    rt = runtime(
        key("sf-a", "a", Policy(name="tenant-a")),
        key("sf-b", "b", Policy(name="tenant-b")),
        key("sf-s", "s", Policy(name="sharing", share_prefix_cache=True)),
        key("sf-none", "none"),
    )
    scopes = {s: (await admit(bearer(s), IP, chat(), runtime=rt)).cache_scope for s in ("sf-a", "sf-b", "sf-s", "sf-none")}
    assert scopes["sf-a"] != scopes["sf-b"] and "" not in (scopes["sf-a"], scopes["sf-b"])
    assert scopes["sf-s"] == scopes["sf-none"] == ""  # keyless requests and sharing policies share one scope
    assert (await admit({}, IP, chat(), runtime=rt)).cache_scope == ""


async def test_pinning_a_prefix_is_a_policy_permission() -> None:
    rt = runtime(key("sf-plain", "plain", Policy(name="p")), key("sf-pin", "pin", Policy(name="pin", allow_pin_prefix=True)))
    headers = {"x-superfluid-pin-prefix": "true"}
    err = await expect("pin_prefix_forbidden", admit(bearer("sf-plain", **headers), IP, chat(), runtime=rt))
    assert err.status == 403 and err.param == "x-superfluid-pin-prefix"
    assert (await admit(bearer("sf-pin", **headers), IP, chat(), runtime=rt)).pin_prefix
    assert not (await admit(bearer("sf-plain"), IP, chat(), runtime=rt)).pin_prefix
    assert (await admit(headers, IP, chat(), runtime=rt)).pin_prefix  # no key: the server's defaults


@pytest.mark.parametrize(("qos", "priority", "band"), [("interactive", 100, "interactive"), ("completion", 0, "normal"), ("agent", 0, "normal"), ("background", -100, "batch")])
async def test_without_the_priority_header_the_priority_is_the_anchor_of_the_class_band(qos: str, priority: int, band: str) -> None:
    """The several-models router orders and swaps by priority alone: a chat sent with
    x-superfluid-qos: interactive (no X-LlamaSwap-Priority) had priority 0, as agent traffic,
    and waited behind the loaded model's agents until its aging beat their swap affinity (ten
    minutes at the defaults); a background job competed with agents for swaps."""
    admission = await admit({"x-superfluid-qos": qos}, IP, chat(), runtime=runtime())
    assert (admission.qos, admission.priority, admission.band) == (QosClass[qos.upper()], priority, band)
    # the header, where sent, is the priority, whatever the class
    admission = await admit({"x-superfluid-qos": qos, "x-llamaswap-priority": "7"}, IP, chat(), runtime=runtime())
    assert admission.priority == 7


async def test_a_key_policys_default_class_sets_its_band_and_the_tier_offset_counts_inside_it() -> None:
    p = Policy(name="jobs", default_class=QosClass.BACKGROUND, max_class=QosClass.AGENT, priority_offset=2)
    rt = runtime(key("sf-k", "k", p))
    admission = await admit(bearer("sf-k"), IP, chat(), runtime=rt)
    assert (admission.qos, admission.priority, admission.band) == (QosClass.BACKGROUND, -98, "batch")
    admission = await admit(bearer("sf-k", **{"x-superfluid-qos": "agent"}), IP, chat(), runtime=rt)  # demoted no further
    assert (admission.qos, admission.priority, admission.band) == (QosClass.AGENT, 2, "normal")
    assert (await admit({}, IP, fim(), runtime=runtime())).priority == 0  # fill-in-the-middle: completion's band
