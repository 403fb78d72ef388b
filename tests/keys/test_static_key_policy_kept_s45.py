"""The static key (SUPERFLUID_API_KEY) follows its policy by name (SUPERFLUID_API_KEY_POLICY),
not as a row: the admin listed that policy with 0 keys and deleted or renamed it without a word,
and from then on every request with the container's key was 401. It is kept as a policy an
admin key follows is kept."""

from __future__ import annotations

import pytest
from django.db.models import ProtectedError
from django.test import Client, override_settings

from keys import actions
from keys.credentials import digest_of
from keys.models import KeyPolicy
from keys.runtime import load_snapshot
from scheduler.core.qos import QosClass

STATIC = "container-secret-0123456789"
FOLLOWS = override_settings(SUPERFLUID_API_KEY_SHA256=digest_of(STATIC), SUPERFLUID_API_KEY_POLICY="containers")


def policy_form(name: str, policy: KeyPolicy) -> dict[str, str]:
    return {
        "name": name,
        "default_class": str(policy.default_class),
        "max_class": str(policy.max_class),
        "rate_limit_rpm": "5",
        "max_concurrent": "0",
        "priority_offset": "0",
        "allowed_models": "",
        "seen_updated": policy.updated.isoformat(),
    }


def the_static_key_is_served() -> bool:
    key = load_snapshot().lookup(STATIC)
    return key is not None and key.policy is not None and key.policy.name == "containers"


@pytest.mark.django_db
@FOLLOWS
def test_the_policy_the_static_key_follows_cannot_be_deleted(admin_client: Client) -> None:
    policy = actions.save_policy(KeyPolicy(name="containers", default_class=int(QosClass.BACKGROUND), max_class=int(QosClass.AGENT)))
    other = actions.save_policy(KeyPolicy(name="spare"))
    r = admin_client.get("/admin/keys/keypolicy/")
    assert r.status_code == 200
    r = admin_client.post(f"/admin/keys/keypolicy/{policy.pk}/delete/", {"post": "yes"})
    assert r.status_code == 200 and "SUPERFLUID_API_KEY_POLICY=containers" in r.content.decode()
    r = admin_client.post("/admin/keys/keypolicy/", {"action": "delete_selected", "_selected_action": [policy.pk, other.pk], "post": "yes"})
    assert "SUPERFLUID_API_KEY_POLICY=containers" in r.content.decode()
    with pytest.raises(ProtectedError):
        actions.delete_policies([policy])
    assert KeyPolicy.objects.filter(name__in=["containers", "spare"]).count() == 2
    assert the_static_key_is_served()
    assert actions.delete_policies([other]) == 1  # a policy nothing follows goes as before


@pytest.mark.django_db
@FOLLOWS
def test_the_policy_the_static_key_follows_cannot_be_renamed_but_stays_editable(admin_client: Client) -> None:
    policy = actions.save_policy(KeyPolicy(name="containers"))
    r = admin_client.post(f"/admin/keys/keypolicy/{policy.pk}/change/", policy_form("containers-v2", policy))
    assert r.status_code == 200 and "Change the variable first" in r.content.decode()
    assert the_static_key_is_served()
    r = admin_client.post(f"/admin/keys/keypolicy/{policy.pk}/change/", policy_form("containers", policy))
    assert r.status_code == 302
    assert KeyPolicy.objects.get(pk=policy.pk).rate_limit_rpm == 5 and the_static_key_is_served()


@pytest.mark.django_db
def test_without_a_static_key_the_policy_of_that_name_is_any_policy() -> None:
    with override_settings(SUPERFLUID_API_KEY_SHA256="", SUPERFLUID_API_KEY_POLICY="containers"):
        policy = actions.save_policy(KeyPolicy(name="containers"))
        policy.name = "renamed"
        actions.save_policy(policy)
        assert actions.delete_policies([policy]) == 1
