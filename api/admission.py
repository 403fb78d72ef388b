"""Who may ask for what: the key, a request's class, priority and lane kind, and its limits,
decided before it is queued.

``authenticate()`` runs first, before the body is read as JSON (401 comes before any 400);
``admit()`` runs once the body is parsed:

1. model: a policy's allowed models (403 ``model_forbidden``);
2. class: x-superfluid-qos, else the band of X-LlamaSwap-Priority, else the key's default class
   (the server's without a policy); a key may demote freely, asking above its best class with
   x-superfluid-qos is 403 ``qos_class_forbidden``, while a priority in a band above it is
   clamped to the policy (the header is never an error); fill-in-the-middle always runs as
   ``completion``;
3. priority: the header's number, clamped to +-PRIORITY_LIMIT, plus the policy's tier offset
   (never enough to cross a band);
4. batch-invariant lanes: 403 unless the policy or ``--http-allow-batch-invariant`` grants them;
5. limits, all checked before any is taken: the key's requests-per-minute bucket (or, without a
   key limit, the per-IP ``--rate-limit``), the fill-in-the-middle bucket per client
   (``--completion-rate``/``--completion-burst``), the key's concurrency slots or, without a key,
   the client address's (``--client-concurrency``); 429 with ``Retry-After``. A key's requests
   in flight are counted whether or not its policy sets ``max_concurrent``, so a limit set while
   some run counts them. Then the model's
   queue bound (``--max-queue`` waiting beyond the lanes): 503 ``queue_full`` with a
   ``Retry-After`` from the measured drain rate. ``Admission.release()`` gives it all back when
   the response ends; ``Admission.refund()`` gives the rate tokens back too, for a request
   refused 503 ``engine_unavailable`` before any engine saw it.

``admit_tool()`` takes the same rate and concurrency limits for /tokenize, /detokenize and
/apply-template.

Secrets never leave this module: logs and records carry the key's name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone

from keys.credentials import secret_from_headers
from keys.limits import TokenBucket, parse_rate, retry_after_s
from keys.runtime import Key, KeyRuntime, Policy
from scheduler.aio import spawn
from scheduler.core.qos import (
    BAND_SPACING,
    PRIORITY_ALIASES,
    QosClass,
    UnknownQosClass,
    band_of,
    class_of_priority,
    parse_priority,
    parse_qos,
    priority_parses,
)
from superfluid_site.runtime import key_runtime
from superfluid_site.serving import serving

from .errors import ApiError, engine_unavailable, invalid_request
from .schemas import GenerationRequest

log = logging.getLogger("superfluid.api")


@dataclass(frozen=True)
class Principal:
    """Who sent a request: a key (when one was presented and is valid) and the client address."""

    key: Key | None = None
    client_ip: str | None = None

    @property
    def key_name(self) -> str | None:
        return self.key.name if self.key is not None else None

    @property
    def name(self) -> str | None:
        return self.key_name

    @property
    def policy(self) -> Policy | None:
        return self.key.policy if self.key is not None else None

    @property
    def is_admin(self) -> bool:
        return self.policy is not None and self.policy.is_admin

    @property
    def client_id(self) -> str:
        """Per-client limits are keyed by the key's name, else by the client's address."""
        return f"key:{self.key.name}" if self.key is not None else f"ip:{self.client_ip or '-'}"


@dataclass
class Admission:
    """What a request was granted. ``release()`` must be called when its response ends."""

    qos: QosClass
    priority: int
    batch_invariant: bool = False
    key_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    runtime: KeyRuntime | None = None
    slot: str | None = None  # the concurrency slot held, by key name
    client_slot: str | None = None  # a keyless client's slot, by address
    model_slot: str | None = None  # the place held in the model's queue bound
    pin_prefix: bool = False  # x-superfluid-pin-prefix, granted
    cache_scope: str = ""  # prefix-cache partition: "" shared (keyless, sharing policies), else the policy's
    # Redis mode: the concurrency slots held in Redis (key's, keyless client's) and this admission's member
    shared_slots: list[str] = field(default_factory=list)
    shared_member: str = ""
    # the rate tokens taken (this head's buckets; in Redis mode the buckets' name, rate, capacity),
    # given back by refund() when the server refuses the request before its engine sees it
    buckets: list[TokenBucket] = field(default_factory=list)
    shared_buckets: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def band(self) -> str:
        return band_of(self.priority)

    def refund(self) -> asyncio.Task[None] | None:
        """Give back the rate tokens this request took (the key's or client's requests per
        minute, the fill-in-the-middle bucket): for a request the server refused for its own
        reasons before its engine saw it (503 ``engine_unavailable``: no worker, the model did
        not load, shutting down), which should not cost its caller quota. Once only. No await:
        a cancel (the client gone) cannot come between it and ``release()``; Redis's buckets
        get theirs back from a task of its own (returned)."""
        buckets, self.buckets = self.buckets, []
        for bucket in buckets:
            bucket.give_back()
        if not self.shared_buckets:
            return None
        from keys.limits import shared_limiter

        shared, self.shared_buckets = self.shared_buckets, []
        return spawn(_refunding, shared_limiter(serving().redis_url).refund(shared))

    async def release(self) -> None:
        """Give back every place held: this head's own first, with no await between them, so a
        cancel (the client gone, a shutdown) cannot cut them short; then the slots held in Redis,
        whose round trips a cancel does not stop either (they lapse after a minute otherwise)."""
        rt = self.runtime
        if rt is not None:
            if self.slot is not None:
                rt.slots.release(self.slot)
                self.slot = None
            if self.client_slot is not None:
                rt.client_slots.release(self.client_slot)
                self.client_slot = None
            if self.model_slot is not None:
                rt.in_flight.release(self.model_slot)
                rt.drain.note()
                self.model_slot = None
        if self.shared_slots:
            from keys.limits import shared_limiter

            slots, self.shared_slots = self.shared_slots, []
            limiter = shared_limiter(serving().redis_url)
            await asyncio.shield(_release_all(limiter, slots, self.shared_member))


# -- errors ----------------------------------------------------------------------------


def invalid_api_key(message: str) -> ApiError:
    return ApiError(401, message, type="authentication_error", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def forbidden(message: str, code: str, param: str | None = None) -> ApiError:
    return ApiError(403, message, type="permission_error", param=param, code=code)


def rate_limited(message: str, code: str, wait_s: float) -> ApiError:
    return ApiError(429, message, type="rate_limit_error", code=code, headers={"Retry-After": str(retry_after_s(wait_s))})


def keys_required() -> bool:
    return bool(serving().keys_required)


# -- authentication --------------------------------------------------------------------


async def authenticate(headers: dict[str, str], client: tuple[str, int] | list[Any] | None, runtime: KeyRuntime | None = None) -> Principal:
    """The key presented in ``Authorization: Bearer`` or ``x-api-key`` (header names lower-cased).

    A revoked or expired key is always 401. A missing or unknown key is 401 when keys are
    required (``--require-key``, or binding beyond loopback); otherwise the request goes on
    without a key (clients like ``openai`` always send some key).
    """
    rt = runtime or key_runtime()
    snapshot = await rt.ready()
    client_ip = str(client[0]) if client else None
    secret = secret_from_headers(headers)
    key = snapshot.lookup(secret) if secret is not None else None
    if key is not None and key.revoked:
        raise invalid_api_key("This API key has been revoked.")
    if key is not None and key.is_expired(timezone.now()):
        raise invalid_api_key("This API key has expired.")
    if key is None and keys_required():
        if secret is None:
            raise invalid_api_key("You didn't provide an API key. Send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'.")
        raise invalid_api_key("Incorrect API key provided.")
    if key is not None:
        rt.touch(key)
    return Principal(key=key, client_ip=client_ip)


async def as_it_is_now(principal: Principal, rt: KeyRuntime) -> Principal:
    """``principal`` with its key as the snapshot has it now. A request is authenticated before
    its body is parsed, and may then wait for the engine worker (``--engine-wait-s``) before it
    is admitted: a key revoked, expired, rotated or deleted meanwhile is refused as
    ``authenticate`` would refuse it now, and one whose policy changed is admitted under the new
    policy. The client (a Batch API line's is its batch) stays."""
    if principal.key is None:
        return principal
    snapshot = await rt.ready()
    key = snapshot.keys_by_digest.get(principal.key.digest)
    if key is not None and key.revoked:
        raise invalid_api_key("This API key has been revoked.")
    if key is not None and key.is_expired(timezone.now()):
        raise invalid_api_key("This API key has expired.")
    if key is None and keys_required():
        raise invalid_api_key("Incorrect API key provided.")
    return dataclasses.replace(principal, key=key)


def _request_headers(request: HttpRequest) -> dict[str, str]:
    """A Django request's headers as the generation endpoints read them (api/consumers.py):
    names lower-cased, the last of repeated headers wins. Django joins repeated headers with a
    comma, so a key header given twice ("Bearer a" and "Bearer b") was no key at all here while
    the generation endpoints took the last."""
    scope = getattr(request, "scope", None)  # ASGI; the test client's WSGI request has none
    if isinstance(scope, dict) and isinstance(scope.get("headers"), list):
        return {bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1") for k, v in scope["headers"]}
    return {k.lower(): v for k, v in request.headers.items()}


def key_required(admin: bool = False) -> Callable[[Callable[..., Awaitable[HttpResponse]]], Callable[..., Awaitable[HttpResponse]]]:
    """For plain async Django views: authenticate like the generation endpoints (the principal
    goes on ``request.principal``); with ``admin=True`` and keys required, only an admin key."""

    def wrap(view: Callable[..., Awaitable[HttpResponse]]) -> Callable[..., Awaitable[HttpResponse]]:
        @functools.wraps(view)
        async def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            headers = _request_headers(request)
            try:
                principal = await authenticate(headers, (request.META.get("REMOTE_ADDR") or "", 0))
                if admin and keys_required() and not principal.is_admin:
                    raise forbidden("This route needs a key whose policy has the admin flag.", "admin_key_required")
            except ApiError as exc:
                response = JsonResponse(exc.body(), status=exc.status)
                for name, value in exc.headers.items():
                    response[name] = value
                return response
            request.principal = principal  # type: ignore[attr-defined]
            # api/metrics.py reads .name and .is_admin of the scraping key from here
            request.superfluid_key = principal if principal.key is not None else None  # type: ignore[attr-defined]
            return await view(request, *args, **kwargs)

        return inner

    return wrap


# -- class and priority ----------------------------------------------------------------


# Where a priority enters, it is clamped into this range: far beyond the bands (100 apart) and
# aging, far inside int32 (the activity log's column, the worker's float score).
PRIORITY_LIMIT = 1_000_000


def clamp_priority(priority: int) -> int:
    return max(-PRIORITY_LIMIT, min(PRIORITY_LIMIT, priority))


# each band's anchor, the priority its offsets count from (round(priority / 100) took 50 for
# normal's and 150 for interactive's twice: ties to even)
BAND_ANCHORS = {"interactive": BAND_SPACING, "normal": 0, "batch": -BAND_SPACING}


def moved_into(qos: QosClass, priority: int) -> int:
    """``priority`` for a request that runs in ``qos`` whatever it asked (a batch line runs at
    background): moved into that class's band if it was above it, keeping its place relative to
    its own band's anchor (a key's tier offset). The router orders and swaps models by priority
    alone, so a batch line at a normal-band priority would have competed with agents."""
    if class_of_priority(priority) >= qos:
        return priority
    anchor = clamp_to_policy(qos)
    return within_band(anchor + priority - BAND_ANCHORS[band_of(priority)], band_of(anchor))


def within_band(priority: int, band: str) -> int:
    """``priority`` moved to the nearest value inside ``band`` (see ``band_of``)."""
    low, high = {"interactive": (BAND_SPACING // 2, PRIORITY_LIMIT), "normal": (1 - BAND_SPACING // 2, BAND_SPACING // 2 - 1),
                 "batch": (-PRIORITY_LIMIT, -(BAND_SPACING // 2))}[band]
    return max(low, min(high, priority))


def clamp_to_policy(max_class: QosClass) -> int:
    """The priority a header in a band above ``max_class`` is clamped to: the anchor of the best
    band whose class the key may have (the header alone never makes a 403)."""
    for anchor in sorted(PRIORITY_ALIASES.values(), reverse=True):
        if class_of_priority(anchor) >= max_class:
            return anchor
    return min(PRIORITY_ALIASES.values())


def resolve_class(headers: dict[str, str], request: GenerationRequest, default: QosClass | None = None) -> tuple[QosClass, int, bool]:
    """(class, priority, whether the client asked for the class).

    Class from x-superfluid-qos, else from the priority header's band, else ``default`` (the
    server's --http-default-qos when None). Fill-in-the-middle always runs as completion.
    Priority from X-LlamaSwap-Priority; without that header, the anchor of the band the class
    runs in (:func:`class_anchor`).
    """
    raw_priority = headers.get("x-llamaswap-priority")
    if raw_priority is not None and not priority_parses(raw_priority):
        # the seed's "absent/unparseable means 0": unparseable is absent, so it picks no class
        # (``X-LlamaSwap-Priority: high`` ran a background key's request as agent)
        raw_priority = None
    priority = clamp_priority(parse_priority(raw_priority))

    def resolved(qos: QosClass, asked: bool) -> tuple[QosClass, int, bool]:
        return qos, priority if raw_priority is not None else class_anchor(qos), asked

    if request.suffix is not None:
        return resolved(QosClass.COMPLETION, False)  # fill-in-the-middle always runs as completion
    cfg = serving()
    raw_qos = headers.get("x-superfluid-qos") if cfg.http_qos_header else None
    if raw_qos is not None:
        try:
            return resolved(parse_qos(raw_qos), True)
        except UnknownQosClass as exc:
            raise invalid_request(str(exc), param="x-superfluid-qos", code="invalid_qos_class") from None
    if raw_priority is not None and cfg.http_qos_header:
        return class_of_priority(priority), priority, True
    if default is None:
        default = parse_qos(cfg.http_default_qos)
    return resolved(default, False)


def class_anchor(qos: QosClass) -> int:
    """The priority of a request of class ``qos`` that sent no X-LlamaSwap-Priority: the anchor
    of the band that class runs in (interactive 100; completion and agent 0, normal's; background
    -100). The request-priority seed reads an absent header as 0, but with several models the
    router orders and swaps by priority alone: a chat sent as interactive for a model not loaded
    waited behind agent traffic for the loaded one until its aging beat their swap affinity (10
    points at 60 s each: ten minutes), and background work competed for swaps with agents."""
    return clamp_to_policy(qos)


def wants_batch_invariant(headers: dict[str, str]) -> bool:
    return headers.get("x-superfluid-batch-invariant", "").strip().lower() in ("1", "true", "yes")


# -- admission -------------------------------------------------------------------------


async def admit(
    headers: dict[str, str],
    client: tuple[str, int] | list[Any] | None,
    request: GenerationRequest,
    principal: Principal | None = None,
    runtime: KeyRuntime | None = None,
    decided: Callable[[QosClass, int], None] | None = None,
    run_in: QosClass | None = None,
) -> Admission:
    """Decide class, priority and lane kind for one request and take its limits, or raise.
    ``decided`` hears the class and priority as soon as they are known, so that a request
    refused after that (403 for its class or headers, 429, 503 queue_full) is logged with them.
    ``run_in``: the class it runs in whatever it asks (a batch line's, background), its priority
    moved with it (:func:`moved_into`); ``decided`` hears those, for a refused line too."""

    def decide(qos: QosClass, priority: int) -> tuple[QosClass, int]:
        if run_in is not None:
            qos, priority = run_in, moved_into(run_in, priority)
        if decided is not None:
            decided(qos, priority)
        return qos, priority

    rt = runtime or key_runtime()
    if principal is None:
        principal = await authenticate(headers, client, rt)
    else:
        principal = await as_it_is_now(principal, rt)
    policy = principal.policy

    if policy is not None and not model_allowed(policy, request.model):
        raise forbidden(f"This API key may not use the model `{request.model}`.", "model_forbidden", "model")

    qos, priority, asked = resolve_class(headers, request, policy.default_class if policy is not None else None)
    if policy is not None and class_of_priority(priority) < policy.max_class:
        # a priority in a band above the key's best class, whatever class the request runs in (the
        # router orders and swaps models by priority alone): the policy's anchor, never an error
        priority = clamp_to_policy(policy.max_class)
    by_qos_header = serving().http_qos_header and "x-superfluid-qos" in headers
    if policy is not None and asked and qos < policy.max_class and not by_qos_header:
        qos = policy.max_class  # only X-LlamaSwap-Priority asked: the key's best class
    if policy is not None and asked and qos < policy.max_class:
        decide(qos, priority)  # the class it asked for
        raise forbidden(
            f"This API key may ask for classes up to {policy.max_class.label}, not {qos.label}.",
            "qos_class_forbidden",
            "x-superfluid-qos",
        )
    if policy is not None:
        # the tier offset orders work inside the band, never across one (request-priority seed):
        # a header of 49 plus +39 stays normal, -50 plus +39 stays batch
        priority = within_band(clamp_priority(priority + policy.priority_offset), band_of(priority))
    qos, priority = decide(qos, priority)

    batch_invariant = wants_batch_invariant(headers)
    if batch_invariant and not (serving().http_allow_batch_invariant or (policy is not None and policy.allow_batch_invariant)):
        raise forbidden("Batch-invariant lanes are not allowed for this client.", "batch_invariant_forbidden", "x-superfluid-batch-invariant")

    pin_prefix = headers.get("x-superfluid-pin-prefix", "").strip().lower() in ("1", "true", "yes")
    if pin_prefix and policy is not None and not policy.allow_pin_prefix:
        raise forbidden("This API key may not pin prefixes.", "pin_prefix_forbidden", "x-superfluid-pin-prefix")

    admission = Admission(qos=qos, priority=priority, batch_invariant=batch_invariant, key_name=principal.key_name, runtime=rt)
    admission.pin_prefix = pin_prefix
    admission.cache_scope = "" if policy is None or policy.share_prefix_cache else f"policy:{policy.name}"
    if serving().redis_url:
        await take_shared_limits(rt, principal, request, admission)
    else:
        take_limits(rt, principal, request, admission)
    return admission


async def take_shared_limits(rt: KeyRuntime, principal: Principal, request: GenerationRequest | None, admission: Admission) -> None:
    """Redis mode: the same limits as :func:`take_limits`, counted in Redis for every head (one
    Lua script checks all, then takes all): rates, the key's and a keyless client's concurrency.
    A key's requests in flight are counted there whether or not its policy sets
    ``max_concurrent`` (a limit set later counts those already running). Redis unreachable: 503
    with Retry-After, never a count of this process's own, which would multiply the limits by the
    number of heads; only a request with nothing to enforce (a key without limits) goes on,
    uncounted. The model's queue bound (``--max-queue``) stays
    this head's own: it bounds what this head holds, with its own drain rate's Retry-After."""
    from keys.limits import LimitsUnavailable, client_slot, key_slot, shared_limiter

    cfg = serving()
    policy = principal.policy
    checks: list[tuple[str, float, float, str, str]] = []  # name, rate/s, capacity, code, message
    if policy is not None and policy.rate_limit_rpm > 0:
        rpm = policy.rate_limit_rpm
        checks.append((f"key:{principal.key_name}", rpm / 60.0, rpm, "rate_limit_exceeded", f"Rate limit reached for this API key: {rpm} requests per minute."))
    elif cfg.rate_limit > 0:
        rpm = int(cfg.rate_limit)
        checks.append((f"ip:{principal.client_ip}", rpm / 60.0, rpm, "rate_limit_exceeded", f"Rate limit reached for this client: {rpm} requests per minute."))
    if request is not None and request.suffix is not None:
        rate = parse_rate(str(cfg.completion_rate))
        if rate > 0:
            burst = max(1, int(cfg.completion_burst))
            checks.append((f"fim:{principal.client_id}", rate, burst, "completion_rate_limited", "Too many fill-in-the-middle completions from this client."))
    slots: list[tuple[str, int, str]] = []  # Redis slot, limit, message
    limit = policy.max_concurrent if policy is not None else 0
    if principal.key_name is not None:
        # counted with or without a limit (COUNT_ONLY never refuses), so that a limit an admin
        # sets later counts the requests already running
        slots.append((key_slot(principal.key_name), limit if limit > 0 else COUNT_ONLY, f"This API key already has {limit} requests in flight; wait for one to finish."))
    client_limit = int(cfg.client_concurrency) if principal.key is None else 0
    if client_limit > 0:
        slots.append((client_slot(principal.client_id), client_limit, f"This client already has {client_limit} requests in flight; wait for one to finish."))
    # The head's own queue bound first, and its place taken before the await, so no other
    # request on this loop can slip in between; given back if Redis refuses.
    model = ""
    if request is not None:
        model, model_lanes = queue_model(request.model, fim=request.suffix is not None)
        check_queue(rt, model, model_lanes)
        rt.in_flight.acquire(model)
        admission.model_slot = model
    if not checks and not slots:
        return
    member = uuid.uuid4().hex
    limiter = shared_limiter(cfg.redis_url)
    try:
        refused, wait_s = await limiter.take([(c[0], c[1], c[2]) for c in checks], [(s[0], s[1]) for s in slots], member)
    except BaseException as exc:  # Redis unreachable (a script that timed out may have run), or
        # cancelled (the client went away) while Redis answered: nothing else gives these back
        _forget_member(limiter, [s[0] for s in slots], member)
        if isinstance(exc, LimitsUnavailable) and not checks and all(s[1] == COUNT_ONLY for s in slots):
            # nothing to enforce, only a key's running requests to count: served uncounted
            # rather than refused (a key with no limits never needed Redis to be admitted)
            log.warning("shared limits unavailable; key %s admitted without its in-flight count", principal.key_name)
            return
        _give_back_model_slot(rt, admission)
        if isinstance(exc, LimitsUnavailable):
            raise engine_unavailable("The shared limits (Redis) cannot be checked right now; retry after the time in the Retry-After header.", retry_after=5) from None
        raise
    if refused:
        _give_back_model_slot(rt, admission)
        if refused <= len(checks):
            _name, _rate, _cap, code, message = checks[refused - 1]
            raise rate_limited(message + " Retry after the time in the Retry-After header.", code, wait_s)
        _slot, held, message = slots[refused - len(checks) - 1]
        # the model it runs on (an alias's id, the --fim-model), whose requests it waits behind
        raise rate_limited(message, "concurrency_limit_exceeded", float(max(wait_s, _own_turn_s(rt, model, held))))
    admission.shared_slots = [s[0] for s in slots]
    admission.shared_member = member
    admission.shared_buckets = [(c[0], c[1], c[2]) for c in checks]


# The limit of a key's Redis slot when its policy sets none: never reached, so the slot only
# counts the key's requests in flight (a max_concurrent set later counts them at once).
COUNT_ONLY = 1 << 31

_forgetting: set[asyncio.Task[None]] = set()
_refunding: set[asyncio.Task[None]] = set()  # Redis refunds under way (Admission.refund)


def _forget_member(limiter: Any, slots: list[str], member: str) -> None:
    """Give back the Redis slots ``member`` may hold, from a task of its own: the caller is being
    cancelled, or is about to answer. (Without it a slot stays taken for the slot's hour.)"""
    if not slots:
        return
    spawn(_forgetting, _release_all(limiter, slots, member))


async def _release_all(limiter: Any, slots: list[str], member: str) -> None:
    for slot in slots:
        await limiter.release(slot, member)


def _give_back_model_slot(rt: KeyRuntime, admission: Admission) -> None:
    """A refused request leaves the queue bound without counting as served (no drain note)."""
    if admission.model_slot is not None:
        rt.in_flight.release(admission.model_slot)
        admission.model_slot = None


def take_limits(rt: KeyRuntime, principal: Principal, request: GenerationRequest | None, admission: Admission) -> None:
    """Check every limit, then take them all: a refused request takes nothing. No await in
    here, so no other request on this event loop can slip between the check and the take.
    ``request`` None: a tokenizer route's (:func:`admit_tool`), with no model queue bound."""
    cfg = serving()
    policy = principal.policy
    buckets = []
    if policy is not None and policy.rate_limit_rpm > 0:
        rpm = policy.rate_limit_rpm
        bucket = rt.buckets.bucket(("key", principal.key_name), rpm / 60.0, rpm)
        buckets.append((bucket, "rate_limit_exceeded", f"Rate limit reached for this API key: {rpm} requests per minute."))
    elif cfg.rate_limit > 0:
        rpm = int(cfg.rate_limit)
        bucket = rt.buckets.bucket(("ip", principal.client_ip), rpm / 60.0, rpm)
        buckets.append((bucket, "rate_limit_exceeded", f"Rate limit reached for this client: {rpm} requests per minute."))
    if request is not None and request.suffix is not None:
        rate = parse_rate(str(cfg.completion_rate))
        burst = max(1, int(cfg.completion_burst))
        if rate > 0:
            bucket = rt.completion_buckets.bucket(principal.client_id, rate, burst)
            buckets.append((bucket, "completion_rate_limited", "Too many fill-in-the-middle completions from this client."))
    # the first bucket that refuses names the error; Retry-After is the longest wait of all that
    # refuse, since the request passes only once every one of them has a token
    waits = [bucket.wait_s() for bucket, _code, _message in buckets]
    for wait_s, (_bucket, code, message) in zip(waits, buckets, strict=True):
        if wait_s > 0:
            raise rate_limited(message + " Retry after the time in the Retry-After header.", code, max(waits))
    model, model_lanes = queue_model(request.model, fim=request.suffix is not None) if request is not None else ("", 0)
    limit = policy.max_concurrent if policy is not None else 0
    slot = principal.key_name
    if limit > 0 and slot is not None and not rt.slots.available(slot, limit):
        wait = _own_turn_s(rt, model, limit)
        raise rate_limited(f"This API key already has {limit} requests in flight; wait for one to finish.", "concurrency_limit_exceeded", wait)
    client_limit = int(cfg.client_concurrency) if principal.key is None else 0
    client_slot = principal.client_id
    if client_limit > 0 and not rt.client_slots.available(client_slot, client_limit):
        wait = _own_turn_s(rt, model, client_limit)
        raise rate_limited(
            f"This client already has {client_limit} requests in flight; wait for one to finish.", "concurrency_limit_exceeded", wait
        )
    if request is not None:
        check_queue(rt, model, model_lanes)
    for bucket, _code, _message in buckets:
        bucket.take()
        admission.buckets.append(bucket)
    if slot is not None:  # counted with or without a limit: one set later counts what already runs
        rt.slots.acquire(slot)
        admission.slot = slot
    if client_limit > 0:
        rt.client_slots.acquire(client_slot)
        admission.client_slot = client_slot
    if request is not None:
        rt.in_flight.acquire(model)
        admission.model_slot = model


async def admit_tool(principal: Principal, runtime: KeyRuntime | None = None) -> Admission:
    """The limits of a route that does work for a client without the engine (``/tokenize``,
    ``/detokenize`` and ``/apply-template``: a body's worth of text tokenised, or a chat template
    rendered over it, on this process's threads): the key's
    requests per minute (else the per-IP ``--rate-limit``) and its ``max_concurrent`` slot (else
    a keyless client's ``--client-concurrency``), as a generation request takes them, or 429;
    no model queue bound. ``release()`` when the response ends. Without these a key at one
    request a minute could keep every tokenizer thread busy."""
    rt = runtime or key_runtime()
    principal = await as_it_is_now(principal, rt)
    policy = principal.policy
    qos = policy.default_class if policy is not None else parse_qos(serving().http_default_qos)
    admission = Admission(qos=qos, priority=class_anchor(qos), key_name=principal.key_name, runtime=rt)
    if serving().redis_url:
        await take_shared_limits(rt, principal, None, admission)
    else:
        take_limits(rt, principal, None, admission)
    return admission


def lanes() -> int:
    return max(1, int(serving().max_batch))


def model_allowed(policy: Policy, name: str) -> bool:
    """Whether the policy's model list lets a request name ``name``: as listed, or, with several
    models, as the same model by another of its names (an alias of a listed id, the id of a
    listed alias): "a request may name a model by id or alias"."""
    if policy.allows_model(name):
        return True
    from scheduler.link.pool import get_pool

    pool = get_pool()
    target = pool.resolve(name) if pool is not None else None
    return target is not None and any(pool.resolve(listed) == target for listed in policy.allowed_models)  # type: ignore[union-attr]


def key_first(names: list[str], policy: Policy | None) -> list[str]:
    """``names`` (served ids and aliases, the configured order) with the first one the key may
    use moved to the front: the model a route whose ``model`` is optional (/infill, /completion,
    /embedding, /tokenize, /props, ...) takes where the body names none. Unchanged for a key with
    no model list (or no key), and for one that may use none of them (its refusal names the
    first configured, as before)."""
    if policy is None or not policy.allowed_models:
        return names
    first = next((name for name in names if model_allowed(policy, name)), None)
    return names if first is None or first == names[0] else [first, *(name for name in names if name != first)]


def queue_model(name: str, *, fim: bool = False) -> tuple[str, int]:
    """The model a request's place in the queue bound counts against, and its lanes: with several
    models (serve --config) the model it runs on (the id an alias resolves to; the --fim-model
    for fill-in-the-middle) and that model's lanes, so a model's id and aliases share one bound;
    else the name and ``--max-batch``."""
    from scheduler.link.pool import get_pool

    pool = get_pool()
    if pool is None:
        return name, lanes()
    model = pool.route(name, fim=fim) or name
    return model, max(1, pool.setup.lanes.get(model) or lanes())


def check_queue(rt: KeyRuntime, model: str, model_lanes: int) -> None:
    """503 ``queue_full`` when ``--max-queue`` requests already wait for the model's lanes (the
    model and its lanes as ``queue_model`` gives them); ``Retry-After`` is the time the measured
    drain rate needs to serve those waiting."""
    max_queue = int(serving().max_queue)
    if max_queue <= 0:
        return
    in_flight = rt.in_flight.held.get(model, 0)
    waiting = in_flight - model_lanes
    if waiting >= max_queue:
        retry = rt.drain.retry_after_s(waiting)
        raise ApiError(
            503,
            f"The server is full: {waiting} requests are already waiting for `{model}`. Retry after the time in the Retry-After header.",
            type="server_error",
            code="queue_full",
            headers={"Retry-After": str(retry)},
        )


def _own_turn_s(rt: KeyRuntime, model: str, held: int) -> float:
    """Seconds until one of a client's ``held`` requests has likely ended: at the measured drain
    rate, a request leaves every 1/rate seconds, and one in ``in_flight / held`` is theirs."""
    in_flight = max(held, rt.in_flight.held.get(model, 0))
    return float(rt.drain.retry_after_s(math.ceil(in_flight / max(1, held))))
