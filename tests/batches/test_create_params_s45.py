"""POST /v1/batches names what is wrong with its parameters as the rest of the API does: a
parameter given with the wrong type is ``invalid_type``, one left out ``missing_required_parameter``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db(transaction=True)


def create(body: dict[str, Any]) -> Any:
    return Client().post("/v1/batches", json.dumps(body), content_type="application/json")


@pytest.mark.parametrize("file_id", [123, ["file-abc"], {"id": "file-abc"}, True])
def test_an_input_file_id_of_the_wrong_type_is_invalid_type_not_missing(file_id: Any) -> None:
    """``{"input_file_id": 123}`` was answered "Missing required parameter: 'input_file_id'"
    (``missing_required_parameter``): the client had sent it, and looked for a typo in its name."""
    r = create({"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_type", "input_file_id"), error
    assert "Missing" not in error["message"]


def test_a_missing_input_file_id_or_endpoint_is_missing_required_parameter() -> None:
    """A body without ``endpoint`` was 400 ``invalid_value`` ("Invalid value for 'endpoint'"),
    as for an endpoint this server does not run; it is missing, as OpenAI and the input file's
    id say."""
    r = create({"endpoint": "/v1/completions"})
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["param"]) == (400, "missing_required_parameter", "input_file_id")
    r = create({"input_file_id": "", "endpoint": "/v1/completions"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "missing_required_parameter")
    r = create({"input_file_id": "file-abc", "completion_window": "24h"})
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["param"]) == (400, "missing_required_parameter", "endpoint")
    r = create({"input_file_id": "file-abc", "endpoint": "/v1/moderations"})
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["param"]) == (400, "invalid_value", "endpoint")
