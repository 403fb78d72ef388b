"""``/completion`` and ``/infill``'s ``n_predict`` (and its aliases ``max_tokens`` and
``max_completion_tokens``) as llama-server's schema reads them: hard limits -1..INT32_MAX, a 400
naming the field beyond (llama-server's "Value must be between -1 <= value <= 2147483647").
Values up to 2^70 and below -1 were taken (the worker clamped them)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.errors import ApiError
from api.schemas import parse_infill, parse_native_completion_request
from tests.edge.inproc import MODEL

PARSERS = {
    "completion": lambda body: parse_native_completion_request(json.dumps(body).encode(), models=[MODEL]),
    "infill": lambda body: parse_infill(json.dumps(body).encode(), models=[MODEL]),
}
BASE = {"prompt": "a", "input_prefix": "def f(", "input_suffix": ")"}


@pytest.mark.parametrize("route", sorted(PARSERS))
@pytest.mark.parametrize("field", ["n_predict", "max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [2**31, 2**40, 2**70, -2, -(2**31)])
def test_a_limit_out_of_llama_servers_range_is_a_400_naming_it(route: str, field: str, value: int) -> None:
    with pytest.raises(ApiError) as err:
        PARSERS[route]({**BASE, field: value})
    error = err.value.body()["error"]
    assert err.value.status == 400 and error["param"] == field and error["code"] == "invalid_value"
    assert "2147483647" in error["message"]


@pytest.mark.parametrize("route", sorted(PARSERS))
@pytest.mark.parametrize("field", ["n_predict", "max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize(("value", "limit"), [(2**31 - 1, 2**31 - 1), (-1, None), (0, 1), (7, 7)])
def test_a_limit_in_range_is_taken(route: str, field: str, value: int, limit: Any) -> None:
    req = PARSERS[route]({**BASE, field: value})[0]
    assert req.max_tokens == limit
