"""Review of keys, key policies, limits and their admin (second pass): each test here failed
before its fix."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError
from django.test import Client, override_settings
from django.utils import timezone

from api.admission import Principal, admit, authenticate
from api.errors import ApiError
from keys import actions, policyfile
from keys.models import ApiKey, ClassLaneCap, KeyPolicy
from keys.runtime import Policy, Snapshot
from scheduler.core.qos import QosClass

from .test_admission import IP
from .test_admission import chat as _chat
from .test_admission import key as _key
from .test_admission import runtime as _runtime


def _staff_client(django_user_model, *perms: str) -> Client:  # type: ignore[no-untyped-def]
    user = django_user_model.objects.create_user(username="viewer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="keys", codename__in=perms))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
@pytest.mark.parametrize(("action", "revoked_before"), [("revoke_selected", False), ("restore_selected", True)])
def test_a_view_only_admin_can_neither_revoke_nor_restore_keys(django_user_model, action: str, revoked_before: bool) -> None:  # type: ignore[no-untyped-def]
    actions.create_key(ApiKey(name="a", revoked=revoked_before))
    key = ApiKey.objects.get(name="a")
    client = _staff_client(django_user_model, "view_apikey")
    assert client.get("/admin/keys/apikey/").status_code == 200  # may look
    listing = client.get("/admin/keys/apikey/").content.decode()
    assert action not in listing  # the action is not offered
    client.post("/admin/keys/apikey/", {"action": action, "_selected_action": [str(key.pk)], "index": "0"})
    assert ApiKey.objects.get(pk=key.pk).revoked is revoked_before  # and not done when posted anyway


@pytest.mark.django_db
def test_a_view_only_admin_is_not_offered_rotate_secret(django_user_model) -> None:  # type: ignore[no-untyped-def]
    actions.create_key(ApiKey(name="a"))
    key = ApiKey.objects.get(name="a")
    client = _staff_client(django_user_model, "view_apikey")
    page = client.get(f"/admin/keys/apikey/{key.pk}/change/")
    assert page.status_code == 200 and "Rotate secret" not in page.content.decode()
    assert client.post(f"/admin/keys/apikey/{key.pk}/rotate/").status_code == 403
    assert ApiKey.objects.get(pk=key.pk).digest == key.digest


# -- a request is admitted under its key as it is at admission ---------------------------------
# The consumer authenticates before the body is parsed, then may wait for the engine worker
# (--engine-wait-s, 120 s by default: a worker restarting, a model loading) before admit(). A key
# revoked, rotated, deleted or given a tighter policy meanwhile was admitted as it had been.


@pytest.mark.parametrize("change", ["revoked", "expired", "deleted"])
async def test_a_key_revoked_while_its_request_waits_for_the_engine_is_refused_at_admission(change: str) -> None:
    secret, k = _key("sf-k", "k", Policy(name="p"))
    rt = _runtime((secret, k))
    headers = {"authorization": f"Bearer {secret}"}
    with override_settings(SUPERFLUID_KEYS_REQUIRED=True):
        principal = await authenticate(headers, IP, rt)  # before the body is parsed
        # ... the admin revokes the key while the request waits for the engine worker
        if change == "deleted":
            rt.snapshot = Snapshot(version=2)
        else:
            fields = {"revoked": True} if change == "revoked" else {"expires": timezone.now() - timedelta(seconds=1)}
            rt.snapshot = Snapshot(version=2, keys_by_digest={k.digest: dataclasses.replace(k, **fields)})
        with pytest.raises(ApiError) as err:
            await admit(headers, IP, _chat(), principal, runtime=rt)
    assert err.value.code == "invalid_api_key" and err.value.status == 401
    assert not rt.slots.held and not rt.in_flight.held  # it holds nothing


async def test_a_policy_tightened_while_a_request_waits_applies_to_it() -> None:
    secret, k = _key("sf-k", "k", Policy(name="p", max_concurrent=0))
    rt = _runtime((secret, k))
    headers = {"authorization": f"Bearer {secret}"}
    running = await admit(headers, IP, _chat(), runtime=rt)
    waiting = await authenticate(headers, IP, rt)
    # the admin sets max_concurrent 1 (one already runs) while the second waits for the engine
    tight = dataclasses.replace(k, policy=Policy(name="p", max_concurrent=1))
    rt.snapshot = Snapshot(version=2, keys_by_digest={k.digest: tight})
    with pytest.raises(ApiError) as err:
        await admit(headers, IP, _chat(), waiting, runtime=rt)
    assert err.value.code == "concurrency_limit_exceeded"
    await running.release()


async def test_a_batch_lines_principal_keeps_its_own_client_when_re_read() -> None:
    """The Batch API's lines come with a principal of their own (its client is the batch): admission
    re-reads the key, never the client."""
    from batches.runner import batch_client

    secret, k = _key("sf-k", "k", Policy(name="p"))
    rt = _runtime((secret, k))
    with override_settings(SUPERFLUID_RATE_LIMIT=1):
        await admit({}, ("127.0.0.1", 0), _chat(), Principal(key=k, client_ip=batch_client("b1")), runtime=rt)
        await admit({}, ("127.0.0.1", 0), _chat(), Principal(key=k, client_ip=batch_client("b2")), runtime=rt)
        with pytest.raises(ApiError) as err:
            await admit({}, ("127.0.0.1", 0), _chat(), Principal(key=k, client_ip=batch_client("b1")), runtime=rt)
    assert err.value.code == "rate_limit_exceeded"


# -- an error on a field the form does not show was a 500 --------------------------------------


@pytest.mark.django_db
def test_a_key_whose_name_the_policy_file_also_names_can_still_be_edited_and_revoked(admin_client: Client, tmp_path: Path) -> None:
    """The admin key made before the --key-policy file named a key as it is the one served (the
    file's is left out): editing it (revoking it on its page, say) was a 500, as its name is
    read-only there and model validation named it."""
    ApiKey.objects.create(name="ci-bot", digest="b" * 64, prefix="sf-bbbbb")
    path = tmp_path / "policies.json"
    path.write_text(json.dumps({"keys": [{"name": "ci-bot", "sha256": "a" * 64}]}))
    policyfile._loaded.clear()
    try:
        with override_settings(SUPERFLUID_KEY_POLICY_FILE=str(path)):
            key = ApiKey.objects.get()
            page = admin_client.get(f"/admin/keys/apikey/{key.pk}/change/").content.decode()
            match = re.search(r'name="seen_updated" value="([^"]*)"', page)
            assert match is not None
            form = {"policy": "", "owner": "", "notes": "", "expires_0": "", "expires_1": "", "revoked": "on", "seen_updated": match.group(1)}
            r = admin_client.post(f"/admin/keys/apikey/{key.pk}/change/", form)
            assert r.status_code == 302
            assert ApiKey.objects.get().revoked
            with pytest.raises(ValidationError):  # a new key of that name is still refused
                ApiKey(name="ci-bot", digest="c" * 64, prefix="sf-ccccc").full_clean()
    finally:
        policyfile._loaded.clear()


@pytest.mark.django_db
def test_editing_a_cap_of_a_model_no_longer_served_in_the_list_is_an_error_on_the_page(admin_client: Client) -> None:
    """A cap saved while its model was served (or from a process that did not know the served
    models), edited in the caps list: the model's error named a column the list does not edit,
    and Django raised a 500."""
    cap = ClassLaneCap.objects.create(model="old", qos_class=int(QosClass.BACKGROUND), max_lanes=2)
    form = {"form-TOTAL_FORMS": "1", "form-INITIAL_FORMS": "1", "form-MIN_NUM_FORMS": "0", "form-MAX_NUM_FORMS": "1000",
            "form-0-id": str(cap.pk), "form-0-max_lanes": "1", "_save": "Save"}
    with override_settings(SUPERFLUID_MODELS=["smol"]):
        r = admin_client.post("/admin/keys/classlanecap/", form)
    assert r.status_code == 200 and "No model is served under the id" in r.content.decode()
    assert ClassLaneCap.objects.get().max_lanes == 2
    with override_settings(SUPERFLUID_MODELS=["smol"]):  # an error on the column itself stays on it
        r = admin_client.post("/admin/keys/classlanecap/", {**form, "form-0-max_lanes": "99"})
    assert r.status_code == 200 and "Must be between 1 and" in r.content.decode()


@pytest.mark.django_db
def test_a_policy_named_as_the_policy_files_before_it_said_so_can_still_be_edited(admin_client: Client, tmp_path: Path) -> None:
    """That policy is the one in force (the file's keys under the name are left out): tightening
    its limits was refused until it was renamed. A new policy, or a rename, of that name still is."""
    from tests.keys.test_admin import POLICY_FORM

    policy = KeyPolicy.objects.create(name="ci")
    path = tmp_path / "policies.json"
    path.write_text(json.dumps({"policies": [{"name": "ci"}], "keys": [{"name": "bot", "sha256": "a" * 64, "policy": "ci"}]}))
    policyfile._loaded.clear()
    try:
        with override_settings(SUPERFLUID_KEY_POLICY_FILE=str(path)):
            page = admin_client.get(f"/admin/keys/keypolicy/{policy.pk}/change/").content.decode()
            match = re.search(r'name="seen_updated" value="([^"]*)"', page)
            assert match is not None
            r = admin_client.post(f"/admin/keys/keypolicy/{policy.pk}/change/", {**POLICY_FORM, "name": "ci", "max_concurrent": "1", "seen_updated": match.group(1)})
            assert r.status_code == 302, r.content.decode()[:3000]
            assert KeyPolicy.objects.get().max_concurrent == 1
            other = KeyPolicy.objects.create(name="other")
            for row in (KeyPolicy(name="ci"), KeyPolicy(pk=other.pk, name="ci")):  # new, renamed
                with pytest.raises(ValidationError):
                    row.full_clean(validate_unique=False)
    finally:
        policyfile._loaded.clear()
