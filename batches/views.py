"""OpenAI's Files and Batches endpoints (the part of them a batch needs), in OpenAI's shapes so
the unmodified ``openai`` client works: ``client.files.create(purpose="batch")``,
``client.batches.create/retrieve/cancel/list``, ``client.files.content``.

A file or batch belongs to the key that made it (by name; keyless ones to keyless callers);
another key gets 404, as if it did not exist."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.db import connection, transaction
from django.db.models import BinaryField, Q
from django.db.models.functions import Length, Substr
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.multipartparser import MultiPartParserError
from django.http.request import split_domain_port
from django.utils import timezone

from api.admission import key_required
from api.edge import error_response
from api.errors import ApiError, invalid_request, request_too_large
from api.schemas import load_object
from scheduler.aio import spawn

from . import runner
from .asgi import max_file_bytes
from .jsonl import ENDPOINTS, InvalidFile, parse_jsonl
from .models import Batch, File, Line, batch_time, file_time

FINAL_STATUSES = ("completed", "failed", "expired", "cancelled")


def batch_view(view: Callable[..., Awaitable[HttpResponse]]) -> Callable[..., Awaitable[HttpResponse]]:
    """Keys as on every /v1 route; the first call in a process (embedded mode) resumes the
    batches a previous run left unfinished; an ApiError the view raises is its error reply."""

    @key_required()
    @functools.wraps(view)
    async def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        await runner.resume_local()
        try:
            return await view(request, *args, **kwargs)
        except ApiError as exc:
            return error_response(exc)

    return inner


def _owner(request: HttpRequest) -> str:
    return request.principal.key_name or ""  # type: ignore[attr-defined]


def _ts(value: Any) -> int | None:
    return int(value.timestamp()) if value is not None else None


def file_object(f: File) -> dict[str, Any]:
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": _ts(f.created_at), "filename": f.filename,
            "purpose": f.purpose, "status": "processed", "status_details": None, "expires_at": None}


def batch_object(b: Batch) -> dict[str, Any]:
    return {
        "id": b.id, "object": "batch", "endpoint": b.endpoint, "errors": b.errors, "input_file_id": b.input_file_id,
        # an expiring batch winds down as a cancel does, but nobody cancelled it: it shows finalizing
        "completion_window": b.completion_window, "status": "finalizing" if b.status == "cancelling" and b.expired_at else b.status,
        "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id, "created_at": _ts(b.created_at), "in_progress_at": _ts(b.in_progress_at),
        "expires_at": _ts(b.expires_at), "finalizing_at": _ts(b.finalizing_at), "completed_at": _ts(b.completed_at),
        "failed_at": _ts(b.failed_at), "expired_at": _ts(b.expired_at), "cancelling_at": _ts(b.cancelling_at),
        "cancelled_at": _ts(b.cancelled_at),
        "request_counts": {"total": b.total, "completed": b.completed, "failed": b.failed},
        "metadata": b.metadata,
    }


def _not_found(kind: str, ident: str) -> ApiError:
    return ApiError(404, f"No such {kind}: '{ident}'.", param="id", code="not_found")


def _storable(text: str) -> bool:
    """Whether ``text`` can be looked up: PostgreSQL refuses U+0000 in a text parameter (a 500),
    and no id, cursor or purpose stored here holds one."""
    return "\x00" not in text


def max_lines() -> int:
    return int(getattr(settings, "SUPERFLUID_BATCH_MAX_LINES", 50_000))


# -- files ---------------------------------------------------------------------------------


@batch_view
async def files(request: HttpRequest) -> HttpResponse:
    if request.method in ("GET", "HEAD"):
        return JsonResponse(await sync_to_async(_file_list)(request))
    limit = max_file_bytes()  # the whole body was bounded before Django read it (batches/asgi.py)
    try:
        purpose = request.POST.get("purpose")
        upload = request.FILES.get("file")
    except (MultiPartParserError, SuspiciousOperation) as exc:
        raise invalid_request(f"We could not parse the multipart body of your request: {exc}", code="invalid_multipart") from None
    if purpose != "batch":
        raise invalid_request("Invalid value for 'purpose': only 'batch' is supported here.", param="purpose", code="invalid_value")
    if upload is None:
        raise invalid_request("Missing required parameter: 'file' (a multipart file field).", param="file", code="missing_required_parameter")
    if upload.size is None or upload.size > limit:
        raise request_too_large(limit)
    data = upload.read(limit + 1)
    if len(data) > limit:
        raise request_too_large(limit)
    try:  # off the event loop: 8 MiB of lines take a good part of a second, every stream on this head stalled meanwhile
        await asyncio.to_thread(parse_jsonl, data, max_lines())
    except InvalidFile as exc:
        raise invalid_request(f"The batch input file is not valid: {exc}", param="file", code="invalid_file") from None
    name = (upload.name or "batch.jsonl")[:255]
    f = await File.objects.acreate(purpose="batch", filename=name, bytes=len(data), content=data, owner=_owner(request))
    return JsonResponse(file_object(f))


def _file_list(request: HttpRequest) -> dict[str, Any]:
    """OpenAI's list: ``purpose``, ``limit`` (1-10,000, default 10,000), ``order`` (by creation,
    ``desc`` by default) and ``after`` (a file id of the caller's: the page starts after it; one
    deleted since, or of another key, starts after the time it names)."""
    q = request.GET
    owned = File.objects.filter(owner=_owner(request)).defer("content")  # not contents: up to 8 MiB each
    if q.get("purpose"):
        owned = owned.filter(purpose=q["purpose"]) if _storable(q["purpose"]) else owned.none()
    try:
        limit = int(q.get("limit", "10000"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 10_000:
        raise invalid_request("Invalid value for 'limit': expected an integer from 1 to 10000.", param="limit", code="invalid_value")
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_request("Invalid value for 'order': expected 'asc' or 'desc'.", param="order", code="invalid_value")
    sign = "" if order == "asc" else "-"
    owned = owned.order_by(f"{sign}created_at", f"{sign}id")
    if q.get("after"):
        cursor = owned.filter(pk=q["after"]).values_list("created_at", "id").first() if _storable(q["after"]) else None
        if cursor is None and (named := file_time(q["after"])) is not None:
            cursor = (named, q["after"])  # a file deleted since the page was read: its place is in its id
        if cursor is None:
            raise invalid_request(f"Invalid value for 'after': no file {q['after']!r}.", param="after", code="invalid_value")
        later = Q(created_at__gt=cursor[0]) | Q(created_at=cursor[0], id__gt=cursor[1])
        earlier = Q(created_at__lt=cursor[0]) | Q(created_at=cursor[0], id__lt=cursor[1])
        owned = owned.filter(later if order == "asc" else earlier)
    rows = [file_object(f) for f in owned[: limit + 1]]
    data = rows[:limit]  # first_id and last_id as OpenAI's list (and the batch list) has them
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit}


_Owned = TypeVar("_Owned", File, Batch)


def owned_view(model: type[_Owned], *deferred: str) -> Callable[[Callable[[HttpRequest, _Owned], Awaitable[HttpResponse]]], Callable[..., Awaitable[HttpResponse]]]:
    """A batch_view of one of the caller's files or batches, the route's ``pk``: the view is
    handed the row (less its ``deferred`` fields); another owner's is not found, as a missing one."""

    def wrap(view: Callable[[HttpRequest, _Owned], Awaitable[HttpResponse]]) -> Callable[..., Awaitable[HttpResponse]]:
        @batch_view
        @functools.wraps(view)
        async def inner(request: HttpRequest, pk: str) -> HttpResponse:
            row = await model.objects.filter(pk=pk, owner=_owner(request)).defer(*deferred).afirst() if _storable(pk) else None
            if row is None:
                raise _not_found(model.__name__.lower(), pk)
            return await view(request, row)

        return inner

    return wrap


@owned_view(File, "content")  # not read for its size and name: an output file may be hundreds of MiB
async def file_detail(request: HttpRequest, f: File) -> HttpResponse:
    if request.method == "DELETE":
        await sync_to_async(_delete_file)(f)
        return JsonResponse({"id": f.id, "object": "file", "deleted": True})
    return JsonResponse(file_object(f))


def _delete_file(f: File) -> None:
    """Delete ``f`` unless a batch that has not ended reads it. The check and the delete hold the
    file's row, as a batch's creation does (``_create``): neither slips between the other's steps."""
    with transaction.atomic():
        if not File.objects.select_for_update().filter(pk=f.pk).exists():
            raise _not_found("file", f.id)
        running = Batch.objects.filter(input_file=f).exclude(status__in=FINAL_STATUSES).values_list("id", flat=True).first()
        if running is not None:
            raise invalid_request(f"File {f.id} is the input of batch {running}, which has not ended.", param="file_id", code="file_in_use")
        File.objects.filter(pk=f.pk).only("pk").delete()  # a finished batch keeps its lines; its file ids go null


CONTENT_SLICE = 1 << 20  # bytes of a file's content read (and held) at a time by a download


@owned_view(File, "content")  # read in slices below, never whole: an output file may be hundreds of MiB
async def file_content(request: HttpRequest, f: File) -> HttpResponse:
    size = await File.objects.filter(pk=f.pk).values_list(Length("content"), flat=True).afirst()
    if size is None:  # deleted since it was looked up
        raise _not_found("file", f.id)
    response = StreamingHttpResponse(_content_slices(f.pk, size if request.method != "HEAD" else 0), content_type="application/jsonl")
    response["Content-Length"] = str(size)
    return response


async def _content_slices(pk: str, size: int) -> AsyncIterator[bytes]:
    """A file's first ``size`` bytes, CONTENT_SLICE at a time, each read with the database's
    substring (SQLite's and PostgreSQL's work on the BLOB and bytea), never the whole column."""
    for start in range(0, size, CONTENT_SLICE):
        part = await File.objects.filter(pk=pk).values_list(
            Substr("content", start + 1, CONTENT_SLICE, output_field=BinaryField()), flat=True).afirst()
        if part is None:  # deleted meanwhile: the reply ends short of its Content-Length, an error to the client
            return
        yield bytes(part)


# -- batches -------------------------------------------------------------------------------


def _json(request: HttpRequest) -> dict[str, Any]:
    """The body as every route of the API reads it (UTF-8, finite numbers, encodable strings)."""
    return load_object(request.body or b"{}")


def _create(owner: str, host: str, file_id: str, endpoint: str, window: str, metadata: Any) -> Batch:
    f = File.objects.filter(pk=file_id, owner=owner).first() if _storable(file_id) else None
    if f is None:
        raise _not_found("file", file_id)
    if f.purpose != "batch":  # one of the caller's output files: it exists, so not a 404
        raise invalid_request(f"File {file_id} has purpose {f.purpose!r}; a batch's input file needs purpose 'batch'.",
                              param="input_file_id", code="invalid_value")
    try:
        lines = parse_jsonl(bytes(f.content), max_lines())
    except InvalidFile as exc:  # cannot happen for a file uploaded here; kept for safety
        raise invalid_request(f"The batch input file is not valid: {exc}", param="input_file_id", code="invalid_file") from None
    wrong = next((line for line in lines if line.url != endpoint), None)
    if wrong is not None:  # named by its line in the file, as an upload's errors are
        raise invalid_request(f"Line {wrong.line} of the input file (custom_id {wrong.custom_id!r}) is for {wrong.url}, not the batch's endpoint {endpoint}.",
                              param="input_file_id", code="invalid_file")
    # each line's row made ready before the transaction, and written in one statement: building
    # 50,000 model rows and bulk_create's per-field work inside it held SQLite's write lock
    # about 3 s (every other write of the server waiting), the statement alone about 0.4 s
    body = Line._meta.get_field("body")
    rows = [(i, line.custom_id, body.get_prep_value(line.body)) for i, line in enumerate(lines)]
    with transaction.atomic():
        # the file's row held from here: one deleted while its lines were read (another head's
        # DELETE) is not found, not a 500 at commit, and a DELETE from now on sees this batch
        if not File.objects.select_for_update().filter(pk=f.pk).exists():
            raise _not_found("file", file_id)
        b = Batch(endpoint=endpoint, completion_window=window, input_file=f, owner=owner, host=host, metadata=metadata, total=len(lines))
        # the window runs from its created_at (the time its id names), as OpenAI's: a clock read
        # before the parse and the lock above made it short of 24 h, 86399 s at a second's turn
        b.expires_at = (batch_time(b.id) or timezone.now()) + timedelta(hours=24)
        b.save(force_insert=True)
        _insert_lines(b.id, rows)
    return b


def _insert_lines(batch_id: str, rows: list[tuple[int, str, str | None]]) -> None:
    """The batch's lines, pending: (index, custom_id, body as its column's text) each; every
    other column gets its field's default, so a field added to Line is written here too."""
    qn = connection.ops.quote_name
    fields = [f for f in Line._meta.concrete_fields if not f.primary_key]
    given = ("batch", "index", "custom_id", "body")
    defaults = [f.get_db_prep_save(f.get_default(), connection) for f in fields if f.name not in given]
    columns = [Line._meta.get_field(name).column for name in given] + [f.column for f in fields if f.name not in given]
    sql = f"INSERT INTO {qn(Line._meta.db_table)} ({', '.join(qn(c) for c in columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
    with connection.cursor() as cursor:
        cursor.executemany(sql, [(batch_id, index, custom_id, text, *defaults) for index, custom_id, text in rows])


@batch_view
async def batches(request: HttpRequest) -> HttpResponse:
    owner = _owner(request)
    if request.method in ("GET", "HEAD"):  # HEAD as GET: it is no create
        try:
            limit = int(request.GET.get("limit", "20"))
        except ValueError:
            raise invalid_request("Invalid value for 'limit': expected an integer.", param="limit", code="invalid_type") from None
        if not 1 <= limit <= 100:  # OpenAI's range; 0 or 500 was read as 1 or 100, without a word
            raise invalid_request("Invalid value for 'limit': expected an integer from 1 to 100.", param="limit", code="invalid_value")
        after = request.GET.get("after")

        def page() -> dict[str, Any]:
            # newest first, ties (batches created in one clock tick) broken by id, so that a page
            # after one of them neither repeats nor skips the others (the client pages by last_id)
            qs = Batch.objects.filter(owner=owner).order_by("-created_at", "-id")
            if after:
                anchor = qs.filter(pk=after).values_list("created_at", "id").first() if _storable(after) else None
                if anchor is None and (named := batch_time(after)) is not None:
                    anchor = (named, after)  # a batch deleted since the page was read: its place is in its id
                if anchor is None:  # as the files list: not the first page again, silently
                    raise invalid_request(f"Invalid value for 'after': no batch {after!r}.", param="after", code="invalid_value")
                qs = qs.filter(Q(created_at__lt=anchor[0]) | Q(created_at=anchor[0], id__lt=anchor[1]))
            rows = list(qs[: limit + 1])
            data = [batch_object(b) for b in rows[:limit]]
            return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit}

        return JsonResponse(await sync_to_async(page)())
    body = await asyncio.to_thread(_json, request)  # up to 2.5 MiB of JSON: off the event loop
    file_id, endpoint, window = body.get("input_file_id"), body.get("endpoint"), body.get("completion_window", "24h")
    metadata = body.get("metadata")
    if file_id is None or file_id == "":
        raise invalid_request("Missing required parameter: 'input_file_id'.", param="input_file_id", code="missing_required_parameter")
    if not isinstance(file_id, str):  # given, as a number or an object: not "missing", as it was told
        raise invalid_request("Invalid type for 'input_file_id': expected a string (a file id).", param="input_file_id", code="invalid_type")
    if endpoint is None:
        raise invalid_request("Missing required parameter: 'endpoint'.", param="endpoint", code="missing_required_parameter")
    if endpoint not in ENDPOINTS:
        raise invalid_request(f"Invalid value for 'endpoint': expected one of {', '.join(ENDPOINTS)}.", param="endpoint", code="invalid_value")
    if window != "24h":
        raise invalid_request("Invalid value for 'completion_window': only '24h' is supported.", param="completion_window", code="invalid_value")
    if metadata is not None and (not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values())):
        # given, as a string, an array or with a number for a value: its type is wrong, as for input_file_id
        raise invalid_request("Invalid type for 'metadata': expected an object of string values.", param="metadata", code="invalid_type")
    if metadata is not None and (len(metadata) > 16 or not all(len(k) <= 64 and len(v) <= 512 for k, v in metadata.items())):
        raise invalid_request("Invalid value for 'metadata': at most 16 string pairs (keys up to 64, values up to 512 characters).",
                              param="metadata", code="invalid_value")
    host = request.get_host()
    if len(host) > Batch._meta.get_field("host").max_length:  # not a 500 (PostgreSQL): a DNS name has up to 253 characters
        host = split_domain_port(host)[0]  # and then its port; the lines' Host check ignores the port
        if len(host) > Batch._meta.get_field("host").max_length:
            raise invalid_request("The Host header is longer than any DNS name.", code="invalid_host")

    async def create_and_start() -> Batch:
        b = await sync_to_async(_create)(owner, host, file_id, endpoint, window, metadata)
        await runner.start(b.id)
        return b

    # shielded: a client that leaves while a large file is read (Django cancels the view) would
    # otherwise leave a batch created and never started, "validating" for good
    b = await asyncio.shield(spawn(_creating, create_and_start()))
    return JsonResponse(batch_object(await Batch.objects.aget(pk=b.id)))


_creating: set[asyncio.Task[Batch]] = set()


@owned_view(Batch)
async def batch_detail(request: HttpRequest, b: Batch) -> HttpResponse:
    return JsonResponse(batch_object(b))


@owned_view(Batch)
async def batch_cancel(request: HttpRequest, b: Batch) -> HttpResponse:
    b, began = await sync_to_async(runner.cancel)(b.id)
    shown = batch_object(b)
    # ended, or winding down as its window ran out (shown "finalizing": nobody can cancel an
    # expiry): OpenAI's answer (the SDK's ConflictError). A second cancel of a batch being
    # cancelled is that batch, as the first cancel's was.
    if not began and (b.status in FINAL_STATUSES or b.expired_at is not None):
        raise ApiError(409, f"Cannot cancel a batch with status '{shown['status']}'.")
    return JsonResponse(shown)
