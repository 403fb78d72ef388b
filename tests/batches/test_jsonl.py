"""The batch input file, read hostilely: anything is either a list of valid lines or one
InvalidFile naming the problem, never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batches.jsonl import ENDPOINTS, InvalidFile, parse_jsonl


def line(custom_id: str = "a", **over: object) -> bytes:
    obj = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}
    obj.update(over)
    return (json.dumps(obj) + "\n").encode()


def test_a_valid_file_gives_its_lines_in_order() -> None:
    lines = parse_jsonl(line("x") + b"\n" + line("y", url="/v1/completions", body={"prompt": "p"}), 10)
    assert [(x.custom_id, x.url) for x in lines] == [("x", "/v1/chat/completions"), ("y", "/v1/completions")]


def test_separators_other_than_newline_inside_a_line_are_text_and_crlf_files_read() -> None:
    """A file written with ensure_ascii=False holds U+2028, U+0085 and the like as they are; they
    are not line ends (they used to split the line: 400 "not valid JSON")."""
    text = "a\u2028b\u0085c\u2029d\x1ce"
    data = (json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"prompt": text}}, ensure_ascii=False) + "\r\n").encode()
    lines = parse_jsonl(data + line("y", url="/v1/completions", body={"prompt": "p"}).replace(b"\n", b"\r\n"), 10)
    assert [(x.custom_id, x.body["prompt"]) for x in lines] == [("x", text), ("y", "p")]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "no requests"),
        (b"\xff\xfe", "UTF-8"),
        (b"{", "Line 1: not valid JSON"),
        (b"[]", "Line 1: expected a JSON object"),
        (line() + line(), "Line 2: duplicate custom_id"),
        (line(method="GET"), "'method'"),
        (line(url="/v1/moderations"), "'url'"),
        (line(body=[1]), "'body'"),
        (line(body={"stream": True}), "'stream'"),
        (line(custom_id=""), "'custom_id'"),
        (line(custom_id=5), "'custom_id'"),
        (line(extra=1), "unknown field 'extra'"),
        (b"[" * 100_000, "not valid JSON"),
        # deeper than the bound but within what Python's parser reads here: refused by the bound,
        # which is the same however deep in the stack the line is read again (batch create, a runner)
        (line(body={"x": json.loads("[" * 300 + "]" * 300)}), "Line 1: nested more than 128 levels deep"),
        (line(custom_id="\ud800"), "lone surrogate"),  # the database cannot store it: was a 500 at batch create
        (line(body={"prompt": "a\udfff"}), "lone surrogate"),
        # not JSON though Python's json reads them: the upload passed and batch create was a 500
        (line(body={"prompt": "p", "temperature": float("nan")}), "Line 1: not valid JSON"),
        (line(body={"prompt": "p", "temperature": float("inf")}), "Line 1: not valid JSON"),
        (line(body={"prompt": "p"}).replace(b'"p"}', b'"p", "top_p": 1e999}'), "Line 1: not valid JSON"),
        # lines of characters str.strip() takes but JSON does not: refused, not skipped as blank
        (line() + b"\x0b\n" + line("b"), "Line 2: not valid JSON"),
        (b"\x1c\n" + line(), "Line 1: not valid JSON"),
        ("\u0085\u3000".encode() + b"\n" + line(), "Line 1: not valid JSON"),
        # PostgreSQL's text columns refuse NUL: the upload passed and batch create was a 500
        (line() + line(custom_id="a\u0000b"), "Line 2: 'custom_id' must not hold U+0000"),
    ],
)
def test_bad_files_name_the_problem(data: bytes, words: str) -> None:
    with pytest.raises(InvalidFile) as err:
        parse_jsonl(data, 10)
    assert words in str(err.value)


def test_a_line_nested_to_the_bound_is_taken() -> None:
    from batches.jsonl import MAX_DEPTH

    def nested(depth: int) -> bytes:  # the line is one level, its body two
        return line(body={"x": json.loads("[" * (depth - 2) + "]" * (depth - 2))})

    assert [x.custom_id for x in parse_jsonl(nested(MAX_DEPTH), 10)] == ["a"]
    with pytest.raises(InvalidFile, match="nested"):
        parse_jsonl(nested(MAX_DEPTH + 1), 10)
    with pytest.raises(InvalidFile, match="nested"):  # objects count as arrays do
        parse_jsonl(line(body={"x": json.loads('{"a": ' * MAX_DEPTH + "1" + "}" * MAX_DEPTH)}), 10)


def test_a_byte_order_mark_at_the_start_is_not_part_of_the_first_line() -> None:
    """Editors on Windows write one; the first line was refused as not JSON."""
    assert [x.custom_id for x in parse_jsonl("\ufeff".encode() + line("x") + line("y"), 10)] == ["x", "y"]


def test_lines_of_json_whitespace_are_blank() -> None:
    assert [x.custom_id for x in parse_jsonl(b" \t\r\n" + line("x") + b"\n\r\n" + line("y") + b"  ", 10)] == ["x", "y"]


def test_the_line_bound_holds() -> None:
    with pytest.raises(InvalidFile, match="more than 2 requests"):
        parse_jsonl(line("a") + line("b") + line("c"), 2)
    assert len(parse_jsonl(line("a") + line("b"), 2)) == 2


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
fields = st.fixed_dictionaries({}, optional={
    "custom_id": st.text(max_size=4) | json_values,
    "method": st.sampled_from(["POST", "GET", "post"]) | json_values,
    "url": st.sampled_from([*ENDPOINTS, "/v1/x"]) | json_values,
    "body": st.dictionaries(st.sampled_from(["stream", "model", "x"]), json_values, max_size=3) | json_values,
})


@settings(max_examples=300, deadline=None)
@given(st.lists(fields | json_values, max_size=5) | st.binary(max_size=64))
def test_any_input_is_lines_or_one_clear_error(value: object) -> None:
    data = value if isinstance(value, bytes) else b"\n".join(json.dumps(v).encode() for v in value)  # type: ignore[attr-defined]
    try:
        lines = parse_jsonl(data, 4)
    except InvalidFile as exc:
        assert str(exc)
        return
    assert 0 < len(lines) <= 4
    assert len({x.custom_id for x in lines}) == len(lines)
    for x in lines:
        assert x.url in ENDPOINTS and isinstance(x.body, dict) and x.body.get("stream") in (None, False)
