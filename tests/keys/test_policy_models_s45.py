"""A policy's allowed models name served models: an entry no request can name (a typo, another
case) allowed nothing, and a list of only such entries locked the policy's keys out of every
model (403 model_forbidden) although the admin had saved it without a word."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client, override_settings

from keys import actions
from keys.models import KeyPolicy
from scheduler.core.qos import QosClass
from tests.keys.test_admin import POLICY_FORM

FORM = {**POLICY_FORM, "max_class": str(int(QosClass.AGENT))}  # the admin's form, as tests/keys/test_admin.py fills it
SEVERAL = {"SUPERFLUID_MODELS": ["smol", "big"], "SUPERFLUID_MODEL_PATHS": [("smol", "/m/s.gguf"), ("tiny", "/m/s.gguf"), ("big", "/m/b.gguf")]}


@pytest.mark.django_db
@override_settings(**SEVERAL)
@pytest.mark.parametrize("listed", ["smol-typo", "Smol", "smol, bgi"], ids=["typo", "case", "one-of-two"])
def test_a_policy_listing_a_model_no_request_can_name_is_refused(admin_client: Client, listed: str) -> None:
    r = admin_client.post("/admin/keys/keypolicy/add/", {**FORM, "allowed_models": listed})
    assert r.status_code == 200 and "No model is served under" in r.content.decode()
    assert "big, smol, tiny" in r.content.decode()  # what it may name: ids and aliases
    assert not KeyPolicy.objects.exists()
    with pytest.raises(ValidationError):
        actions.save_policy(KeyPolicy(name="p", allowed_models=listed))


@pytest.mark.django_db
@override_settings(**SEVERAL)
@pytest.mark.parametrize("listed", ["smol", "tiny", "smol, big\ntiny", ""], ids=["id", "alias", "several", "all"])
def test_served_ids_and_aliases_are_accepted(admin_client: Client, listed: str) -> None:
    r = admin_client.post("/admin/keys/keypolicy/add/", {**FORM, "allowed_models": listed})
    assert r.status_code == 302, r.content.decode()
    assert KeyPolicy.objects.get().allowed_models == listed


@pytest.mark.django_db
def test_a_model_no_longer_served_leaves_the_rest_of_the_policy_editable() -> None:
    """A policy saved while "old" was served stays editable after "old" left the config; a new
    unknown entry is still refused."""
    with override_settings(SUPERFLUID_MODELS=["old", "smol"]):
        policy = actions.save_policy(KeyPolicy(name="p", allowed_models="old, smol"))
    with override_settings(SUPERFLUID_MODELS=["smol"]):
        policy.rate_limit_rpm = 10
        actions.save_policy(policy)
        policy.allowed_models = "old, smol, nwe"
        with pytest.raises(ValidationError, match="nwe"):
            actions.save_policy(policy)


@pytest.mark.django_db
def test_a_process_that_does_not_know_the_served_models_accepts_any() -> None:
    with override_settings(SUPERFLUID_MODELS=[]):
        assert actions.save_policy(KeyPolicy(name="p", allowed_models="anything")).model_list == ["anything"]
