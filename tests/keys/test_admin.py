"""The admin, through Django's test client: the secret shown once, saves that bump the version."""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import ValidationError
from django.test import Client, override_settings

from keys import actions
from keys.credentials import digest_of
from keys.models import ApiKey, ClassLaneCap, ConfigVersion, KeyPolicy
from keys.runtime import read_version
from scheduler.core.qos import QosClass

SECRET = re.compile(r"sf-[A-Za-z0-9_-]{43}")

POLICY_FORM = {
    "name": "team",
    "default_class": str(int(QosClass.AGENT)),
    "max_class": str(int(QosClass.COMPLETION)),
    "rate_limit_rpm": "0",
    "max_concurrent": "0",
    "priority_offset": "0",
    "allowed_models": "",
}


@pytest.mark.django_db
def test_adding_a_key_shows_its_secret_once_and_stores_only_the_digest(admin_client: Client) -> None:
    policy = actions.save_policy(KeyPolicy(name="team"))
    before = read_version()
    r = admin_client.post("/admin/keys/apikey/add/", {"name": "alice", "policy": str(policy.pk), "owner": "Alice", "notes": "", "expires_0": "", "expires_1": ""})
    assert r.status_code == 200 and "no-store" in r["Cache-Control"]
    page = r.content.decode()
    secrets = set(SECRET.findall(page))
    assert len(secrets) == 1
    secret = secrets.pop()
    key = ApiKey.objects.get(name="alice")
    assert key.digest == digest_of(secret) and key.prefix == secret[:8] and key.policy == policy
    assert read_version() == before + 1
    # never again: not on the change page, the list, or in the session or message cookies
    for url in (f"/admin/keys/apikey/{key.pk}/change/", "/admin/keys/apikey/", "/admin/keys/apikey/?q=alice"):
        later = admin_client.get(url)
        assert later.status_code == 200 and secret not in later.content.decode()
        assert key.prefix in later.content.decode()
    assert all(secret not in str(c.value) for c in admin_client.cookies.values())
    assert secret not in str(dict(admin_client.session))


@pytest.mark.django_db
def test_the_revoke_action_revokes_and_bumps_the_version(admin_client: Client) -> None:
    actions.create_key(ApiKey(name="a"))
    actions.create_key(ApiKey(name="b"))
    a = ApiKey.objects.get(name="a")
    before = read_version()
    r = admin_client.post("/admin/keys/apikey/", {"action": "revoke_selected", "_selected_action": [str(a.pk)], "index": "0"})
    assert r.status_code == 302
    assert ApiKey.objects.get(name="a").revoked and not ApiKey.objects.get(name="b").revoked
    assert read_version() == before + 1
    listing = admin_client.get("/admin/keys/apikey/?status=revoked").content.decode()
    assert ">a<" in listing and ">b<" not in listing


@pytest.mark.django_db
def test_editing_a_policy_in_the_admin_saves_through_the_action(admin_client: Client) -> None:
    r = admin_client.post("/admin/keys/keypolicy/add/", POLICY_FORM)
    assert r.status_code == 302, r.content.decode()[:2000]
    policy = KeyPolicy.objects.get(name="team")
    version = ConfigVersion.objects.get(pk=1).version
    r = admin_client.post(f"/admin/keys/keypolicy/{policy.pk}/change/", {**POLICY_FORM, "default_class": str(int(QosClass.COMPLETION))})
    assert r.status_code == 302
    assert KeyPolicy.objects.get(pk=policy.pk).default_class == QosClass.COMPLETION
    assert ConfigVersion.objects.get(pk=1).version == version + 1


@pytest.mark.django_db
@pytest.mark.parametrize(("field", "value"), [("max_class", str(int(QosClass.BACKGROUND))), ("priority_offset", "40"), ("priority_offset", "-40")])
def test_the_policy_form_refuses_what_could_break_the_rules(admin_client: Client, field: str, value: str) -> None:
    r = admin_client.post("/admin/keys/keypolicy/add/", {**POLICY_FORM, field: value})
    assert r.status_code == 200 and "errornote" in r.content.decode()
    assert not KeyPolicy.objects.exists()


@pytest.mark.django_db
@override_settings(SUPERFLUID_MAX_BATCH=4)
def test_a_class_lane_cap_above_max_batch_is_refused_in_the_admin(admin_client: Client) -> None:
    form = {"model": "", "qos_class": str(int(QosClass.BACKGROUND)), "max_lanes": "5"}
    r = admin_client.post("/admin/keys/classlanecap/add/", form)
    assert r.status_code == 200 and "--max-batch (4)" in r.content.decode()
    r = admin_client.post("/admin/keys/classlanecap/add/", {**form, "max_lanes": "2"})
    assert r.status_code == 302
    assert ClassLaneCap.objects.get().max_lanes == 2


@pytest.mark.django_db
@override_settings(SUPERFLUID_MODELS=["smol", "big"], SUPERFLUID_MODEL_PATHS=[("smol", "/m/s.gguf"), ("tiny", "/m/s.gguf"), ("big", "/m/b.gguf")])
@pytest.mark.parametrize("name", ["Smol", "smol-typo", "tiny"], ids=["case", "typo", "alias"])
def test_a_class_lane_cap_names_a_served_models_id(admin_client: Client, name: str) -> None:
    """A cap whose model no worker serves under that id (a typo, another case, an alias: caps go
    by id) would be saved and do nothing; it is refused, naming the ids."""
    form = {"model": name, "qos_class": str(int(QosClass.BACKGROUND)), "max_lanes": "1"}
    r = admin_client.post("/admin/keys/classlanecap/add/", form)
    assert r.status_code == 200 and "big, smol" in r.content.decode()
    assert not ClassLaneCap.objects.exists()
    with pytest.raises(ValidationError):
        actions.set_cap(int(QosClass.BACKGROUND), 1, model=name)
    assert admin_client.post("/admin/keys/classlanecap/add/", {**form, "model": "smol"}).status_code == 302
    assert admin_client.post("/admin/keys/classlanecap/add/", {**form, "model": ""}).status_code == 302


@pytest.mark.django_db
def test_the_admin_pages_render(admin_client: Client) -> None:
    actions.create_key(ApiKey(name="k", policy=actions.save_policy(KeyPolicy(name="p"))))
    actions.set_cap(int(QosClass.BACKGROUND), 2)
    for url in ("/admin/", "/admin/keys/", "/admin/keys/apikey/", "/admin/keys/apikey/add/", "/admin/keys/keypolicy/",
                "/admin/keys/keypolicy/add/", "/admin/keys/classlanecap/", "/admin/keys/classlanecap/add/",
                "/admin/keys/apikey/?status=active", "/admin/keys/apikey/?status=expired"):
        assert admin_client.get(url).status_code == 200, url



@pytest.mark.django_db(transaction=True)
def test_the_version_check_gets_past_a_connection_the_database_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    # The key runtime's check keeps its thread's connection between reads; one the database has
    # closed meanwhile (a restart, an idle timeout) fails its next read, which must cost a new
    # connection, not a failed check. (The drop is simulated: the first read fails as it would.
    # Outside a test transaction, so that the connection the check closes is really closed.)
    from django.db import OperationalError

    from keys import runtime

    actions.create_key(ApiKey(name="a"))
    expected = read_version()
    reads: list[int] = []

    def once_dropped() -> int:
        reads.append(1)
        if len(reads) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return read_version()

    monkeypatch.setattr(runtime, "read_version", once_dropped)
    assert runtime._read_version_keeping_the_connection() == expected
    assert len(reads) == 2


def _change_form(admin_client: Client, key: ApiKey) -> dict[str, str]:
    """What the key's change page posts back as it was rendered (the editable fields)."""
    page = admin_client.get(f"/admin/keys/apikey/{key.pk}/change/").content.decode()
    seen = re.search(r'name="seen_updated" value="([^"]*)"', page)
    assert seen, "the change form carries the row's last change"
    return {
        "name": key.name, "policy": "", "owner": key.owner, "notes": key.notes, "expires_0": "", "expires_1": "",
        "seen_updated": seen.group(1), **({"revoked": "on"} if key.revoked else {}),
    }


@pytest.mark.django_db
def test_a_change_form_opened_before_a_revoke_does_not_restore_the_key(admin_client: Client) -> None:
    """An admin opens bob's page; meanwhile bob is revoked (the bulk action, ``revokekey``). Saving
    the notes on the page opened before would post "not revoked" and silently restore the key:
    it is refused instead, and the key stays revoked."""
    actions.create_key(ApiKey(name="bob"))
    bob = ApiKey.objects.get(name="bob")
    form = _change_form(admin_client, bob)
    actions.revoke_keys([bob])
    r = admin_client.post(f"/admin/keys/apikey/{bob.pk}/change/", {**form, "notes": "owner moved to team B"})
    assert r.status_code == 200 and "changed since this page was opened" in r.content.decode()
    bob.refresh_from_db()
    assert bob.revoked and bob.notes == ""
    fresh = _change_form(admin_client, bob)  # reloaded: the edit goes through
    r = admin_client.post(f"/admin/keys/apikey/{bob.pk}/change/", {**fresh, "notes": "owner moved to team B"})
    assert r.status_code == 302
    bob.refresh_from_db()
    assert bob.revoked and bob.notes == "owner moved to team B"


@pytest.mark.django_db
def test_a_keys_name_stays_what_it_was_created_with(admin_client: Client) -> None:
    """Files, batches, limits and the activity log go by the key's name: a rename would hand
    them to whoever is next given the old name. The admin shows the name read-only, and a save
    with another name is refused."""
    actions.create_key(ApiKey(name="alice"))
    alice = ApiKey.objects.get(name="alice")
    r = admin_client.post(f"/admin/keys/apikey/{alice.pk}/change/", {**_change_form(admin_client, alice), "name": "alice-2023"})
    assert r.status_code == 302
    assert ApiKey.objects.get(pk=alice.pk).name == "alice"
    alice.name = "alice-2023"
    with pytest.raises(ValidationError, match="cannot be renamed"):
        actions.save_key(alice)
    assert ApiKey.objects.get(pk=alice.pk).name == "alice"


@pytest.mark.django_db
def test_a_deleted_keys_name_is_not_given_again_while_its_files_remain(admin_client: Client) -> None:
    from batches.models import File

    actions.create_key(ApiKey(name="alice"))
    f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=0, content=b"", owner="alice")
    actions.delete_keys([ApiKey.objects.get(name="alice")])
    r = admin_client.post("/admin/keys/apikey/add/", {"name": "alice", "policy": "", "owner": "", "notes": "", "expires_0": "", "expires_1": ""})
    assert r.status_code == 200 and "still owns files or batches" in r.content.decode()
    assert not ApiKey.objects.filter(name="alice").exists()
    f.delete()
    actions.create_key(ApiKey(name="alice"))  # nothing left behind: the name is free


@pytest.mark.django_db
@override_settings(SUPERFLUID_MODELS=["smol", "big"], SUPERFLUID_MAX_BATCH=8)
def test_a_models_own_cap_is_checked_against_that_models_lanes(admin_client: Client) -> None:
    """With several models --max-batch is the largest model's lanes: a cap of 5 for a 2-lane
    model was saved, and its worker ignored it (outside 1..its lanes), so the cap shown was never
    in force."""
    from pathlib import Path

    from scheduler.link import pool as pool_module
    from scheduler.models_config import ModelsConfig, ServedModel

    cfg = ModelsConfig((ServedModel("smol", Path("/m/s.gguf")), ServedModel("big", Path("/m/b.gguf"))))
    pool_module.configure(pool_module.PoolSetup(cfg, spawn=lambda *_: None, lanes={"smol": 2, "big": 8}))  # type: ignore[arg-type]
    try:
        form = {"model": "smol", "qos_class": str(int(QosClass.BACKGROUND)), "max_lanes": "5"}
        r = admin_client.post("/admin/keys/classlanecap/add/", form)
        assert r.status_code == 200 and "2 lanes" in r.content.decode()
        assert not ClassLaneCap.objects.exists()
        with pytest.raises(ValidationError):
            actions.set_cap(int(QosClass.BACKGROUND), 5, model="smol")
        assert admin_client.post("/admin/keys/classlanecap/add/", {**form, "max_lanes": "2"}).status_code == 302
        assert admin_client.post("/admin/keys/classlanecap/add/", {**form, "model": "big"}).status_code == 302
        assert admin_client.post("/admin/keys/classlanecap/add/", {**form, "model": ""}).status_code == 302  # all models: up to the largest
    finally:
        pool_module.configure(None)
