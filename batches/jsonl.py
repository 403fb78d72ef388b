"""The Batch API's input file, read hostilely: every line a JSON object with ``custom_id`` (a
non-empty string, unique in the file), ``method`` ``POST``, ``url`` one of the batch endpoints
and ``body`` an object without ``stream: true``. Anything else is one clear error naming the
line; nothing is stored. Pure: no Django."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.errors import ApiError
from api.schemas import check_encodable, json_value

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
MAX_CUSTOM_ID = 512
# Python's parser gives up on nesting near its recursion limit, counted from wherever it is
# called: a line the upload read could fail at the batch's creation, or where a runner reads it
# back from the database (deeper in the stack), and never run. A fixed bound, far below that,
# is the same at every read.
MAX_DEPTH = 128


class InvalidFile(ValueError):
    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"Line {line}: {message}" if line is not None else message)
        self.line = line


@dataclass(frozen=True)
class BatchLine:
    custom_id: str
    url: str
    body: dict[str, Any]
    line: int = 0  # its line in the file (blank lines count), for errors that name it


def parse_jsonl(data: bytes, max_lines: int) -> list[BatchLine]:
    """The lines of a batch input file (blank lines are skipped), or InvalidFile."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidFile("The file is not UTF-8 text.") from None
    text = text.removeprefix("\ufeff")  # a byte-order mark (editors on Windows write one)
    out: list[BatchLine] = []
    seen: set[str] = set()
    # lines end at "\n" only: splitlines() also splits at U+2028, U+0085 and the like, which a
    # JSON string may hold as they are (a file written with ensure_ascii=False)
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip(" \t\r"):  # JSON's own whitespace: str.strip() also takes \x0b, \x1c, U+0085...
            continue  # a line of those is not blank, and is refused as not JSON
        if len(out) >= max_lines:
            raise InvalidFile(f"The file has more than {max_lines} requests.")
        try:
            obj = json_value(raw)  # as the API reads a body: NaN, Infinity and 1e999 are not JSON
        except ValueError:
            raise InvalidFile("not valid JSON.", number) from None
        if not isinstance(obj, dict):
            raise InvalidFile("expected a JSON object.", number)
        if _depth(obj) > MAX_DEPTH:
            raise InvalidFile(f"nested more than {MAX_DEPTH} levels deep.", number)
        try:
            check_encodable(obj)
        except ApiError as exc:  # a lone surrogate ("\ud800"): the database cannot store it
            raise InvalidFile(exc.message, number) from None
        unknown = sorted(set(obj) - {"custom_id", "method", "url", "body"})
        if unknown:
            raise InvalidFile(f"unknown field '{unknown[0]}' (expected custom_id, method, url, body).", number)
        custom_id = obj.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
            raise InvalidFile(f"'custom_id' must be a non-empty string of at most {MAX_CUSTOM_ID} characters.", number)
        if "\x00" in custom_id:  # a text column (PostgreSQL's) cannot hold it
            raise InvalidFile("'custom_id' must not hold U+0000.", number)
        if custom_id in seen:
            raise InvalidFile(f"duplicate custom_id {custom_id!r}; each request needs its own.", number)
        if obj.get("method") != "POST":
            raise InvalidFile("'method' must be \"POST\".", number)
        url = obj.get("url")
        if url not in ENDPOINTS:
            raise InvalidFile(f"'url' must be one of {', '.join(ENDPOINTS)}.", number)
        body = obj.get("body")
        if not isinstance(body, dict):
            raise InvalidFile("'body' must be a JSON object.", number)
        if body.get("stream") not in (None, False):
            raise InvalidFile("'stream' is not supported in a batch.", number)
        seen.add(custom_id)
        out.append(BatchLine(custom_id, url, body, number))
    if not out:
        raise InvalidFile("The file holds no requests.")
    return out


def _depth(value: Any) -> int:
    """How deeply ``value``'s arrays and objects nest (an object of scalars: 1), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
