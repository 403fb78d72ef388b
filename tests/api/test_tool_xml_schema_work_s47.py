"""A reply in Qwen3-Coder's or GLM's tag format is typed by the offered tool's schema (the
client's): each parameter's kinds are read from its schema once per call, not once per value.

A call that repeats a parameter of a long schema (an enum or an ``anyOf`` of thousands of entries;
a hostile client asks the model to repeat it) walked the whole schema at each repetition, its
reply's length times the schema's: a 72 kB reply against a 60 kB schema took ~8 s, on the event
loop that serves every other request. Work is counted (the schema's values looked at), not timed."""

from __future__ import annotations

import pytest

import api.xml_tool_calls as xml
from api.responses import Reply
from scheduler.link.messages import Delta, Done
from tests.api.streamed import assemble, streamed_chunks

ENTRIES, REPEATS = 2_000, 1_000
TOOLS = [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"enum": list(range(ENTRIES))}, "b": {"anyOf": [{"type": "integer"}] * ENTRIES}}}}]
REPLIES = {
    "qwen3_coder": "<tool_call>\n<function=f>\n" + "<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n" * REPEATS + "</function>\n</tool_call>",
    "glm45": "<tool_call>f\n" + "<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n<arg_key>b</arg_key>\n<arg_value>2</arg_value>\n" * REPEATS + "</tool_call>",
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fmt", sorted(REPLIES))
def test_a_call_repeating_a_parameter_of_a_long_schema_reads_the_schema_once(monkeypatch: pytest.MonkeyPatch, fmt: str, stream: bool) -> None:
    looked = 0
    kind_of, kinds = xml._kind_of, xml.value_kinds

    def counted_kind_of(value: object) -> str | None:
        nonlocal looked
        looked += 1
        return kind_of(value)

    def counted_kinds(schema: object, depth: int = 0) -> frozenset[str]:
        nonlocal looked
        looked += 1
        return kinds(schema, depth)

    monkeypatch.setattr(xml, "_kind_of", counted_kind_of)
    monkeypatch.setattr(xml, "value_kinds", counted_kinds)
    reply = Reply("chat", "m", tools=TOOLS, tool_format=fmt)
    if stream:
        streamed = assemble(streamed_chunks(reply, [REPLIES[fmt]]))
        calls = [c["arguments"] for c in streamed.calls]
    else:
        reply.add(Delta("j", REPLIES[fmt]))
        message = reply.body(Done("j", "stop"), None)["choices"][0]["message"]
        calls = [c["function"]["arguments"] for c in message["tool_calls"]]
    assert calls == ['{"a": 1, "b": 2}']
    assert looked <= 4 * (2 * ENTRIES + 2 * REPEATS), looked
