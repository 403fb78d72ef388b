"""``response_fields`` on /completion and /infill: each path is looked up in every result object
(each prompt's, each stream's last frame) on the event loop. A body of two million paths with 32
prompts was a minute of that loop, every other request stalled; now more than
MAX_RESPONSE_FIELDS is a 400 naming the parameter, and a path is split only as deep as a result
has values."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.errors import ApiError
from api.responses import pick_fields
from api.schemas import MAX_RESPONSE_FIELDS, parse_native_completion_request
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, request


def test_more_paths_than_the_bound_is_a_400_naming_response_fields() -> None:
    body = {"prompt": ["a"] * 32, "response_fields": [f"f{i}" for i in range(MAX_RESPONSE_FIELDS + 1)]}
    with pytest.raises(ApiError) as raised:
        parse_native_completion_request(json.dumps(body).encode(), models=[MODEL])
    assert (raised.value.status, raised.value.param, raised.value.code) == (400, "response_fields", "invalid_value")
    body["response_fields"] = body["response_fields"][:MAX_RESPONSE_FIELDS]
    assert parse_native_completion_request(json.dumps(body).encode(), models=[MODEL])[1].response_fields == body["response_fields"]


class _Path(str):
    """A path that counts the parts it is split into."""

    parts = 0

    def split(self, sep: Any = None, maxsplit: int = -1) -> list[str]:  # type: ignore[override]
        out = str.split(self, sep, maxsplit)
        _Path.parts += len(out)
        return out


def test_a_long_path_is_split_only_as_deep_as_a_result_goes() -> None:
    _Path.parts = 0
    obj = {"timings": {"prompt_n": 3}}
    assert pick_fields(obj, [_Path("timings/" * 500_000 + "prompt_n")]) == {}
    assert _Path.parts <= 32


KEYS = st.sampled_from(["content", "timings", "prompt_n", "a", "", "0"])
VALUES = st.recursive(st.integers() | st.text(max_size=2), lambda inner: st.dictionaries(KEYS, inner, max_size=3), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(obj=st.dictionaries(KEYS, VALUES, max_size=4), paths=st.lists(st.lists(KEYS, min_size=1, max_size=5).map("/".join), max_size=6))
def test_fuzz_pick_fields_is_the_value_at_each_path(obj: dict[str, Any], paths: list[str]) -> None:
    expected: dict[str, Any] = {}
    for path in paths:
        value: Any = obj
        for part in path.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            expected[path] = value
    assert pick_fields(obj, paths) == (expected if paths else obj)


@pytest.mark.django_db(transaction=True)
async def test_the_route_answers_the_bound_as_a_400_and_changes_nothing() -> None:
    too_many = json.dumps({"prompt": ["a"] * 32, "n_predict": 1, "response_fields": ["content"] * (MAX_RESPONSE_FIELDS + 1)}).encode()
    fine = json.dumps({"prompt": "a", "n_predict": 1, "response_fields": ["content", "timings/prompt_n"]}).encode()
    async with attached(SimWorker()):
        refused = await request("POST", "/completion", too_many, JSON)
        served = await request("POST", "/completion", fine, JSON)
    assert refused.status == 400 and refused.is_error_object(), refused.body
    assert refused.json()["error"]["param"] == "response_fields"
    assert served.status == 200 and set(served.json()) == {"content", "timings/prompt_n"}, served.body
