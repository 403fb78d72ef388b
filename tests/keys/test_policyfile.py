"""--key-policy FILE: policies and keys kept in a JSON file beside the admin's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import override_settings

from keys import policyfile
from keys.credentials import digest_of
from keys.policyfile import PolicyFileError, parse_policy_file
from keys.runtime import load_snapshot
from scheduler.core.qos import QosClass

SECRET = "sf-from-the-file"


def document(**policy: object) -> dict:
    return {
        "policies": [{"name": "ci", "default_class": "background", "max_class": "agent", "rate_limit_rpm": 60, "allow_pin_prefix": True, **policy}],
        "keys": [{"name": "ci-bot", "sha256": digest_of(SECRET), "policy": "ci"}, {"name": "plain", "sha256": "a" * 64}],
    }


def test_a_policy_file_gives_keys_by_digest_with_their_policy() -> None:
    keys = parse_policy_file(json.dumps(document()))
    key = keys[digest_of(SECRET)]
    assert key.name == "ci-bot" and key.id < 0
    assert key.policy is not None and key.policy.default_class is QosClass.BACKGROUND
    assert key.policy.max_class is QosClass.AGENT and key.policy.rate_limit_rpm == 60 and key.policy.allow_pin_prefix
    assert keys["a" * 64].policy is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        (json.dumps(document(default_class="urgent")), "unknown QoS class"),
        (json.dumps(document(default_class="agent", max_class="background")), "at least as good"),
        (json.dumps(document(priority_offset=60)), "priority_offset"),
        (json.dumps(document(colour="red")), "unknown field"),
        (json.dumps({"keys": [{"name": "k", "sha256": "xyz"}]}), "sha256"),
        (json.dumps({"keys": [{"name": "k", "sha256": "b" * 64, "policy": "nope"}]}), "no policy named"),
        (json.dumps({"keys": [{"name": "k", "sha256": "b" * 64}, {"name": "k", "sha256": "c" * 64}]}), "a second key"),
        # each of these raised a TypeError (a traceback from serve) instead of saying where
        (json.dumps({"policies": 5}), '"policies" must be a list'),
        (json.dumps({"keys": None}), '"keys" must be a list'),
        (json.dumps({"keys": [{"name": "k", "sha256": "b" * 64, "policy": ["p"]}]}), "no policy named"),
        # a name shared with the static key or with keyless requests would share their limits or series
        (json.dumps({"keys": [{"name": "anonymous", "sha256": "b" * 64}]}), "reserved name"),
        (json.dumps({"keys": [{"name": "SUPERFLUID_API_KEY", "sha256": "b" * 64}]}), "reserved name"),
        (json.dumps({"keys": [{"name": "-", "sha256": "b" * 64}]}), "reserved name"),  # the logs' mark for no key
        # a blank model id allowed no model at all (the admin reads a blank list as all of them)
        (json.dumps(document(allowed_models=[" "])), r"allowed_models\[0\] is blank"),
        (json.dumps(document(allowed_models=["m", ""])), r"allowed_models\[1\] is blank"),
    ],
)
def test_a_bad_policy_file_is_refused_with_where_and_why(text: str, message: str) -> None:
    with pytest.raises(PolicyFileError, match=message):
        parse_policy_file(text)


def test_allowed_models_are_read_as_the_admin_reads_them() -> None:
    """Spaces around an id are not part of it, as in the admin's list (``Policy.model_list``)."""
    policy = parse_policy_file(json.dumps(document(allowed_models=[" m ", "n"])))[digest_of(SECRET)].policy
    assert policy is not None and policy.allowed_models == ("m", "n") and policy.allows_model("m")


@pytest.mark.django_db
def test_file_keys_join_the_snapshot_and_a_database_key_with_the_same_digest_wins(tmp_path: Path) -> None:
    from keys.models import ApiKey

    path = tmp_path / "policies.json"
    path.write_text(json.dumps(document()))
    ApiKey.objects.create(name="db-plain", digest="a" * 64, prefix="sf-aaaaa")
    policyfile._loaded.clear()
    with override_settings(SUPERFLUID_KEY_POLICY_FILE=str(path)):
        snap = load_snapshot()
    policyfile._loaded.clear()
    assert snap.lookup(SECRET) is not None and snap.lookup(SECRET).name == "ci-bot"  # type: ignore[union-attr]
    assert snap.keys_by_digest["a" * 64].name == "db-plain"
    with override_settings(SUPERFLUID_KEY_POLICY_FILE=""):
        assert load_snapshot().lookup(SECRET) is None


@pytest.mark.django_db
def test_a_file_key_never_shares_a_name_with_an_admin_key_or_policy(tmp_path: Path) -> None:
    """Limits, concurrency slots, the prefix-cache scope, metrics, files and batches go by key
    and policy names: a file key named as an admin key (or under a policy named as an admin
    policy) shared them with another holder (one's request made the other's a 429). The admin
    refuses such names; a clash made before the file named it leaves the file's key out."""
    from django.core.exceptions import ValidationError

    from keys.models import ApiKey, KeyPolicy

    path = tmp_path / "policies.json"
    path.write_text(json.dumps(document()))
    policyfile._loaded.clear()
    try:
        with override_settings(SUPERFLUID_KEY_POLICY_FILE=str(path)):
            for row, field in ((ApiKey(name="ci-bot", digest="b" * 64, prefix="sf-bbbbb"), "name"), (KeyPolicy(name="ci"), "name")):
                with pytest.raises(ValidationError) as err:
                    row.full_clean()
                assert field in err.value.message_dict and "--key-policy" in err.value.message_dict[field][0]
            ApiKey.objects.create(name="ci-bot", digest="b" * 64, prefix="sf-bbbbb")  # made before the file said it
            snap = load_snapshot()
            assert snap.lookup(SECRET) is None and snap.keys_by_digest["b" * 64].name == "ci-bot"
            assert snap.keys_by_digest["a" * 64].name == "plain"  # the file's other key is unaffected
            ApiKey.objects.filter(name="ci-bot").delete()
            KeyPolicy.objects.create(name="ci")
            assert load_snapshot().lookup(SECRET) is None  # under a policy named as the admin's
            KeyPolicy.objects.filter(name="ci").delete()
            assert load_snapshot().lookup(SECRET) is not None
    finally:
        policyfile._loaded.clear()


def test_serve_stops_on_a_bad_policy_file_before_anything_starts(tmp_path: Path) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"keys": [{"name": "k", "sha256": "short"}]}))
    with pytest.raises(CommandError, match=r"--key-policy .*bad.json: keys\[0\]: sha256"):
        call_command("serve", "--key-policy", str(bad))
    with pytest.raises(CommandError, match="cannot read it"):
        call_command("serve", "--key-policy", str(tmp_path / "missing.json"))


def test_a_policy_file_saved_with_a_byte_order_mark_is_read() -> None:
    """Notepad and PowerShell's ``Set-Content -Encoding UTF8`` begin a UTF-8 file with a BOM:
    ``serve`` refused such a file as "not valid JSON: Unexpected UTF-8 BOM"."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policies.json"
        path.write_text(json.dumps(document()), encoding="utf-8-sig")
        assert policyfile.load_policy_file(path)[digest_of(SECRET)].name == "ci-bot"


@pytest.mark.parametrize("where", ["keys", "policies"])
def test_a_name_longer_than_the_admin_allows_is_refused(where: str) -> None:
    """The admin's names hold at most 100 characters; the file's took any length, and what goes
    by the name did not: the activity log cut it at 200 (the key's usage was nowhere to be found
    under its name, and two such keys shared it) and a batch file's owner column (200) refused
    it on PostgreSQL, a 500 for every upload."""
    long = "team-platform/" + "x" * 200
    doc = document()
    if where == "keys":
        doc["keys"][0]["name"] = long
    else:
        doc["policies"][0]["name"] = long
        doc["keys"][0]["policy"] = long
    with pytest.raises(PolicyFileError, match=rf"{where}\[0\]: .*at most 100 characters"):
        parse_policy_file(json.dumps(doc))
    ok = document()
    ok["keys"][0]["name"] = "k" * 100  # the admin's longest is fine
    assert parse_policy_file(json.dumps(ok))[digest_of(SECRET)].name == "k" * 100


@pytest.mark.parametrize(
    "text",
    [
        # a second "keys" list (two files pasted together): the first list's keys were dropped, all 401
        '{"keys": [{"name": "a", "sha256": "' + "a" * 64 + '"}], "keys": []}',
        # a field given twice: the last silently won
        '{"policies": [{"name": "p", "max_concurrent": 2, "max_concurrent": 0}]}',
        '{"keys": [{"name": "a", "sha256": "' + "a" * 64 + '", "name": "b"}]}',
    ],
)
def test_a_name_given_twice_in_one_object_is_refused(text: str) -> None:
    with pytest.raises(PolicyFileError, match="given twice"):
        parse_policy_file(text)
