"""SUPERFLUID_API_KEY_POLICY naming a policy of the --key-policy file that no file key follows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import override_settings

from keys import policyfile
from keys.credentials import digest_of
from keys.runtime import load_snapshot
from scheduler.core.qos import QosClass

STATIC = "container-secret-0123456789"


@pytest.mark.django_db
def test_the_static_key_follows_a_file_policy_that_no_file_key_uses(tmp_path: Path) -> None:
    """docs/configuration.md: SUPERFLUID_API_KEY_POLICY is "the key policy (admin or
    --key-policy file) the static key follows". A file holding only that policy (the container's
    natural file: its one key is the environment's) was not found -- the static key's policy was
    looked up among the file's keys' policies -- so every request with the static key got 401."""
    path = tmp_path / "policies.json"
    path.write_text(json.dumps({"policies": [{"name": "containers", "default_class": "background", "max_class": "agent"}]}))
    policyfile._loaded.clear()
    try:
        with override_settings(SUPERFLUID_KEY_POLICY_FILE=str(path), SUPERFLUID_API_KEY_SHA256=digest_of(STATIC), SUPERFLUID_API_KEY_POLICY="containers"):
            key = load_snapshot().lookup(STATIC)
    finally:
        policyfile._loaded.clear()
    assert key is not None and key.policy is not None
    assert key.policy.name == "containers" and key.policy.default_class == QosClass.BACKGROUND


@pytest.mark.django_db
def test_the_admin_refuses_a_policy_named_as_a_file_policy_that_no_file_key_uses(tmp_path: Path) -> None:
    """docs/keys.md: "the admin refuses a key or policy named as one in the file". A file policy
    no file key followed (the static key's) was not seen: the admin made one of the same name,
    which then took the static key over from the file's."""
    from django.core.exceptions import ValidationError

    from keys.models import KeyPolicy

    path = tmp_path / "policies.json"
    path.write_text(json.dumps({"policies": [{"name": "containers"}]}))
    policyfile._loaded.clear()
    try:
        with override_settings(SUPERFLUID_KEY_POLICY_FILE=str(path)), pytest.raises(ValidationError) as err:
            KeyPolicy(name="containers").full_clean()
    finally:
        policyfile._loaded.clear()
    assert "--key-policy" in err.value.message_dict["name"][0]
