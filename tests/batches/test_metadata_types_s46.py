"""POST /v1/batches with ``metadata`` of the wrong type is ``invalid_type``, as an
``input_file_id`` of the wrong type is (tests/batches/test_create_params_s45.py) and OpenAI names
it; over OpenAI's bounds (16 pairs, keys of 64 characters, values of 512) it is ``invalid_value``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db(transaction=True)


def create(metadata: Any) -> Any:
    body = {"input_file_id": "file-abc", "endpoint": "/v1/completions", "completion_window": "24h", "metadata": metadata}
    return Client().post("/v1/batches", json.dumps(body), content_type="application/json")


@pytest.mark.parametrize("metadata", ["nightly", ["job", "nightly"], 5, {"job": 1}, {"job": None}, {"job": {"a": "b"}}])
def test_metadata_of_the_wrong_type_is_invalid_type(metadata: Any) -> None:
    """Was ``invalid_value`` "at most 16 string pairs", as if it were too large: the client
    had sent a string or a number where an object of strings goes."""
    r = create(metadata)
    error = r.json()["error"]
    assert (r.status_code, error["code"], error["param"]) == (400, "invalid_type", "metadata"), error


@pytest.mark.parametrize("metadata", [{f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"k": "v" * 513}])
def test_metadata_over_openais_bounds_is_invalid_value(metadata: Any) -> None:
    r = create(metadata)
    error = r.json()["error"]
    assert (r.status_code, error["code"], error["param"]) == (400, "invalid_value", "metadata"), error


@pytest.mark.parametrize("metadata", [{f"k{i}": "v" for i in range(16)}, {"k" * 64: "v" * 512}, {}, None])
def test_metadata_within_the_bounds_passes_to_the_file_lookup(metadata: Any) -> None:
    r = create(metadata)  # no such file: the metadata was taken
    assert (r.status_code, r.json()["error"]["param"]) == (404, "id")
