"""What admission reads about keys, frozen: policies, keys, the class-lane caps, and the static
key's name. A leaf module (no Django, no runtime), so that the database models, the
``--key-policy`` file reader and the key runtime can all build on it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from scheduler.core.qos import QosClass

from .credentials import digest_of, digests_match

# SUPERFLUID_API_KEY: the name it goes by in logs, metrics, the activity log and per-key limits
# (an admin key may not take it), and an id no database row has
STATIC_KEY_NAME = "SUPERFLUID_API_KEY"
ANONYMOUS_KEY_NAME = "anonymous"  # /metrics' key label for requests made without a key
NO_KEY_MARK = "-"  # the access log's key= and the activity log's key filter for no key
# names no key may take: the static key's limits and usage, or every keyless client's series in
# /metrics and rows in the logs, would be shared with it
RESERVED_KEY_NAMES = (STATIC_KEY_NAME, ANONYMOUS_KEY_NAME, NO_KEY_MARK)
STATIC_KEY_ID = -(2**31)


@dataclass(frozen=True)
class Policy:
    name: str
    default_class: QosClass = QosClass.AGENT
    max_class: QosClass = QosClass.AGENT
    allow_batch_invariant: bool = False
    rate_limit_rpm: int = 0
    max_concurrent: int = 0
    priority_offset: int = 0
    allowed_models: tuple[str, ...] = ()
    is_admin: bool = False
    share_prefix_cache: bool = False
    allow_pin_prefix: bool = False

    def allows_model(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


@dataclass(frozen=True)
class Key:
    id: int
    name: str
    digest: str
    policy: Policy | None = None
    expires: datetime | None = None
    revoked: bool = False

    def is_expired(self, now: datetime) -> bool:
        return self.expires is not None and self.expires <= now


def _readings(secret: str) -> list[str]:
    """``secret`` as the server read it, and, where its bytes (Latin-1) are UTF-8 beyond ASCII,
    as the client most likely wrote it."""
    try:
        utf8 = secret.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return [secret]
    return [secret] if utf8 == secret else [secret, utf8]


@dataclass
class Snapshot:
    version: int = -1
    keys_by_digest: dict[str, Key] = field(default_factory=dict)
    class_lanes: dict[str, dict[QosClass, int]] = field(default_factory=dict)  # model ("" = all) -> caps

    def lookup(self, secret: str) -> Key | None:
        """The key whose digest is sha256(secret). A dict finds it by digest; compare_digest
        confirms it without an early-exit comparison. A header reaches here read as Latin-1
        (api/consumers.py, Django): a secret beyond ASCII that the client sent as UTF-8 (curl,
        most tools) is found by its UTF-8 reading too, as its digest was made."""
        for candidate in _readings(secret):
            digest = digest_of(candidate)
            key = self.keys_by_digest.get(digest)
            if key is not None and digests_match(key.digest, digest):
                return key
        return None

    def caps_for(self, model: str) -> dict[str, int]:
        """Caps for ``model``: the all-models rows, overridden by the model's own."""
        caps = dict(self.class_lanes.get("", {}))
        if model:
            caps.update(self.class_lanes.get(model, {}))
        return {qos.label: n for qos, n in sorted(caps.items())}
