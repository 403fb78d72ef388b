"""createkey and revokekey, as scripts call them."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from keys.credentials import digest_of
from keys.models import ApiKey, KeyPolicy
from scheduler.core.qos import QosClass


def createkey(*args: str) -> str:
    out = io.StringIO()
    call_command("createkey", *args, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


@pytest.mark.django_db
def test_createkey_prints_the_secret_last_and_stores_its_digest() -> None:
    secret = createkey("ci")
    key = ApiKey.objects.get(name="ci")
    assert secret.startswith("sf-") and key.digest == digest_of(secret) and key.policy is None


@pytest.mark.django_db
def test_policy_flags_make_a_policy_named_after_the_key() -> None:
    createkey("bot", "--class", "background", "--max-class", "agent", "--rpm", "30", "--max-concurrent", "2",
              "--batch-invariant", "--admin", "--priority-offset", "2", "--models", "a,b")
    p = ApiKey.objects.get(name="bot").policy
    assert p is not None and p.name == "bot"
    assert (p.default_class, p.max_class) == (QosClass.BACKGROUND, QosClass.AGENT)
    assert (p.rate_limit_rpm, p.max_concurrent, p.priority_offset) == (30, 2, 2)
    assert p.allow_batch_invariant and p.is_admin and p.model_list == ["a", "b"]


@pytest.mark.django_db
def test_policy_is_created_once_and_shared_by_name() -> None:
    createkey("one", "--policy", "team", "--class", "interactive")
    createkey("two", "--policy", "team")
    assert KeyPolicy.objects.count() == 1
    assert {k.policy.name for k in ApiKey.objects.all()} == {"team"}  # type: ignore[union-attr]
    with pytest.raises(CommandError, match="exists already"):
        createkey("three", "--policy", "team", "--rpm", "5")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args",
    [
        ("--class", "agent", "--max-class", "background"),  # best class worse than the default
        ("--priority-offset", "40"),
        ("--class", "nonsense"),
    ],
)
def test_invalid_policies_are_refused_and_nothing_is_saved(args: tuple[str, ...]) -> None:
    with pytest.raises(CommandError):
        createkey("bad", *args)
    assert not ApiKey.objects.exists() and not KeyPolicy.objects.exists()


@pytest.mark.django_db
def test_a_duplicate_name_is_refused() -> None:
    createkey("dup")
    with pytest.raises(CommandError, match="exists already"):
        createkey("dup")


@pytest.mark.django_db
def test_revokekey_revokes_by_name() -> None:
    createkey("gone")
    call_command("revokekey", "gone", stdout=io.StringIO())
    assert ApiKey.objects.get(name="gone").revoked
    with pytest.raises(CommandError):
        call_command("revokekey", "nobody", stdout=io.StringIO())


@pytest.mark.django_db
@pytest.mark.parametrize("days", ["inf", "nan", "1e9", "0", "-1"])
def test_an_expiry_no_date_can_hold_is_refused_and_nothing_is_made(days: str) -> None:
    """``--expires-days inf`` (or a billion) overflowed the date with a traceback; NaN, 0 and a
    negative made a key that could never be used."""
    with pytest.raises(CommandError, match="--expires-days"):
        createkey("later", "--rpm", "5", "--expires-days", days)
    assert not ApiKey.objects.filter(name="later").exists() and not KeyPolicy.objects.filter(name="later").exists()


@pytest.mark.django_db
def test_createkey_with_an_unreadable_key_policy_file_is_a_command_error_and_makes_no_key(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new key's name is checked against the --key-policy file's keys (SUPERFLUID_KEY_POLICY):
    a file that cannot be read printed a traceback instead of saying which file and why."""
    import dataclasses

    from keys import policyfile
    from superfluid_site.serving import installed, serving

    monkeypatch.setattr(policyfile, "_loaded", {})
    with installed(dataclasses.replace(serving(), key_policy_file=f"{tmp_path}/gone.json")):
        with pytest.raises(CommandError, match="gone.json.*cannot read it"):
            createkey("ci")
    assert not ApiKey.objects.filter(name="ci").exists()
