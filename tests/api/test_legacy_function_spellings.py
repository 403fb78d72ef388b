"""A request that sends both spellings of its tools (``tools`` and the legacy ``functions``) gets
``tools`` and ``tool_choice``; the legacy ``functions`` and ``function_call`` are named as
ignored (docs/api.md, Tool calls: the legacy API), also when ``tool_choice`` is not sent: the
legacy ``function_call`` names a function of the ignored ``functions``, not of ``tools``."""

from __future__ import annotations

import json
from typing import Any

from api.schemas import GenerationRequest, parse_chat_request

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def chat(**body: Any) -> GenerationRequest:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}).encode()
    return parse_chat_request(raw, models={"m"})


def test_function_call_beside_both_spellings_is_ignored_and_named_without_tool_choice() -> None:
    req = chat(tools=[TOOL], functions=[{"name": "g"}], function_call={"name": "g"})
    assert [t["name"] for t in req.tools or []] == ["f"] and not req.legacy_functions
    assert req.tool_choice == "auto" and req.parallel_tool_calls
    assert req.ignored == ["functions", "function_call"]
    # a legacy "none" does not turn the current spelling's tools off either
    assert chat(tools=[TOOL], functions=[{"name": "f"}], function_call="none").tool_choice == "auto"


def test_function_call_with_tools_alone_still_chooses_among_them() -> None:
    req = chat(tools=[TOOL], function_call={"name": "f"})
    assert req.tool_choice == {"name": "f"} and req.ignored == []
