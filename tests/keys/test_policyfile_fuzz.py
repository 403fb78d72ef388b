"""Fuzz: an operator's --key-policy file either loads or is refused with a PolicyFileError that
says where and why; never another exception, never a key that cannot be used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from keys.credentials import digest_of
from keys.policyfile import _DIGEST, _POLICY_FIELDS, PolicyFileError, load_policy_file, parse_policy_file
from keys.snapshot import RESERVED_KEY_NAMES, Policy

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
# the fields the file knows, with values right and wrong
field_values: st.SearchStrategy[object] = st.sampled_from(["agent", "background", "interactive", "completion", "2", "nope", 0, -1, 40, True, None, [], ["m"], {}])
policies = st.dictionaries(st.sampled_from(sorted(_POLICY_FIELDS) + ["bogus"]), field_values | json_values, max_size=6)
digests = st.sampled_from(["a" * 64, "A" * 64, digest_of("x"), "a" * 63, "a" * 64 + "\n", "g" * 64, "1" * 64]) | st.integers() | json_values
keys = st.dictionaries(st.sampled_from(["name", "sha256", "policy", "extra"]), st.text(max_size=6) | digests | json_values, max_size=4)
documents = st.fixed_dictionaries({}, optional={"policies": st.lists(policies, max_size=3) | json_values, "keys": st.lists(keys, max_size=3) | json_values})


def _check_loaded(keys: dict[str, Any]) -> None:
    for digest, key in keys.items():
        # a digest the server can find a client's key by: exactly sha256's 64 lower-case hex digits
        assert isinstance(digest, str) and _DIGEST.fullmatch(digest) and key.digest == digest
        assert isinstance(key.name, str) and key.name and key.id < 0
        key.name.encode("utf-8")  # names are shown in /metrics, the dashboard and logs
        if key.policy is not None:
            assert isinstance(key.policy, Policy)
            assert key.policy.max_class <= key.policy.default_class
            assert key.policy.rate_limit_rpm >= 0 and key.policy.max_concurrent >= 0


@FAST
@given(documents)
@example({"keys": [{"name": "a", "sha256": "a" * 64 + "\n"}]})  # "$" matched before a trailing newline
@example({"keys": [{"name": "a", "sha256": int("1" * 64)}]})  # a JSON number taken as a digest
@example({"keys": [{"name": "\ud800", "sha256": "a" * 64}]})  # a lone surrogate in a name
def test_any_document_loads_usable_keys_or_is_refused_by_name(document: dict[str, Any]) -> None:
    try:
        keys = parse_policy_file(json.dumps(document))
    except PolicyFileError as exc:
        assert str(exc)
        return
    _check_loaded(keys)


@FAST
@given(st.text(max_size=200) | st.text(alphabet='{}[]":,0123456789 \\nulltruefalse', max_size=200))
@example("[" * 100_000)  # RecursionError from json.loads
@example("1" * 5000)  # ValueError: more digits than int() converts
@example('{"keys": [{"name": "\\ud800", "sha256": "' + "a" * 64 + '"}]}')
def test_any_text_loads_or_is_refused_with_a_policy_file_error(text: str) -> None:
    try:
        keys = parse_policy_file(text)
    except PolicyFileError as exc:
        assert str(exc)
        return
    _check_loaded(keys)


@pytest.mark.parametrize("raw", [b"\xff\xfe{}", b'{"keys": [{"name": "\xe9"}]}', b"\x80"])
def test_a_file_that_is_not_utf8_is_refused_with_a_policy_file_error(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "policy.json"
    path.write_bytes(raw)
    with pytest.raises(PolicyFileError, match="not UTF-8"):
        load_policy_file(path)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=100))
def test_any_file_bytes_load_or_are_refused_with_a_policy_file_error(tmp_path_factory: pytest.TempPathFactory, raw: bytes) -> None:
    path = tmp_path_factory.mktemp("policy") / "policy.json"
    path.write_bytes(raw)
    try:
        keys = load_policy_file(path)
    except PolicyFileError as exc:
        assert str(exc)
        return
    _check_loaded(keys)


# (U+0000 is refused: tests/keys/test_policyfile_nul_s51.py)
@FAST
@given(st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), min_size=1, max_size=20).filter(lambda s: s not in RESERVED_KEY_NAMES), st.text(st.characters(blacklist_categories=["Cs"]), max_size=20), st.booleans())
def test_a_valid_key_loads_under_its_digest_with_its_policy(name: str, secret: str, with_policy: bool) -> None:
    document: dict[str, Any] = {"policies": [{"name": "p", "default_class": "background", "max_class": "agent"}], "keys": [{"name": name, "sha256": digest_of(secret).upper()}]}
    if with_policy:
        document["keys"][0]["policy"] = "p"
    key = parse_policy_file(json.dumps(document))[digest_of(secret)]
    assert key.name == name and (key.policy is not None) == with_policy
