"""The --key-policy file refuses U+0000 in any string, as the admin's forms do: PostgreSQL stores
no such text, so a key or policy named with one (a JSON ``"\\u0000"``) had its activity rows and
batch files refused there, while serve started without a word."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keys.policyfile import PolicyFileError, parse_policy_file

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


def _with_nul(text: str, at: int) -> str:
    at %= len(text) + 1
    return text[:at] + "\x00" + text[at:]


def _file(where: str, value: str) -> dict[str, Any]:
    policy: dict[str, Any] = {"name": "p", "allowed_models": ["m"]}
    key: dict[str, Any] = {"name": "k", "sha256": "a" * 64, "policy": "p"}
    if where == "key name":
        key["name"] = value
    elif where == "policy name":
        policy["name"] = key["policy"] = value
    else:
        policy["allowed_models"] = [value]
    return {"policies": [policy], "keys": [key]}


@settings(max_examples=60, deadline=None)
@given(where=st.sampled_from(["key name", "policy name", "allowed model"]), text=TEXT, at=st.integers(min_value=0))
def test_a_null_character_anywhere_is_refused_with_where_it_is(where: str, text: str, at: int) -> None:
    with pytest.raises(PolicyFileError, match="U\\+0000"):
        parse_policy_file(json.dumps(_file(where, _with_nul(text, at))))


def test_the_same_file_without_it_loads() -> None:
    for where in ("key name", "policy name", "allowed model"):
        assert len(parse_policy_file(json.dumps(_file(where, "ok")))) == 1
