"""superfluid.W001 counts SUPERFLUID_API_KEY as a usable key only when the key can be used: a
SUPERFLUID_API_KEY_POLICY that names a policy neither the admin nor the --key-policy file has
refuses the static key (keys/runtime.py: static_key), and every request with it gets 401. The
check said a usable key existed, so a server bound beyond loopback started without a word."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.checks import usable_key_exists

DIGEST = hashlib.sha256(b"container-secret-0123456789").hexdigest()


@pytest.mark.django_db
def test_a_static_key_whose_policy_exists_nowhere_is_not_usable(settings: Any) -> None:
    settings.SUPERFLUID_API_KEY_SHA256 = DIGEST
    settings.SUPERFLUID_API_KEY_POLICY = "containers"
    assert not usable_key_exists()


@pytest.mark.django_db
def test_a_static_key_is_usable_with_the_server_defaults_or_a_policy_that_exists(settings: Any, tmp_path: Path) -> None:
    from keys.models import KeyPolicy

    settings.SUPERFLUID_API_KEY_SHA256 = DIGEST
    settings.SUPERFLUID_API_KEY_POLICY = ""
    assert usable_key_exists()
    settings.SUPERFLUID_API_KEY_POLICY = "containers"
    path = tmp_path / "policies.json"
    path.write_text(json.dumps({"policies": [{"name": "containers"}]}))
    assert usable_key_exists(str(path))  # a file policy no file key follows
    KeyPolicy.objects.create(name="containers")
    assert usable_key_exists()  # an admin policy
