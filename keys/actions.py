"""Every change to keys, policies and caps goes through one of these functions.

Each saves, bumps ``ConfigVersion`` in the same transaction, and after commit pokes this
process's runtimes (``keys.runtime``) so they reload at once; other processes see the new version
within ``keys.runtime.POLL_S``. The admin and the management commands call these, never a bare
``.save()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import F, ProtectedError
from django.utils import timezone

from .credentials import digest_of, display_prefix, new_secret
from .models import ApiKey, ClassLaneCap, ConfigVersion, KeyPolicy, static_key_policy
from .snapshot import STATIC_KEY_NAME


def _changed() -> None:
    """Bump the version inside the caller's transaction; poke the runtimes once it commits."""
    if ConfigVersion.objects.filter(pk=1).update(version=F("version") + 1) == 0:
        ConfigVersion.objects.create(pk=1, version=1)
    transaction.on_commit(_notify)


def _notify() -> None:
    from superfluid_site.runtime import poke_keys

    poke_keys()


_Row = TypeVar("_Row", bound=models.Model)


@transaction.atomic
def _save(row: _Row) -> _Row:
    """Validate and save one row, and bump the version with it."""
    row.full_clean()
    row.save()
    _changed()
    return row


@transaction.atomic
def _delete(model: type[models.Model], rows: Iterable[models.Model]) -> int:
    """Delete the rows of ``model`` that ``rows`` name, and bump the version with them."""
    n, _ = model._default_manager.filter(pk__in=[r.pk for r in rows]).delete()
    _changed()
    return n


# -- keys ------------------------------------------------------------------------------


@transaction.atomic
def create_key(key: ApiKey) -> str:
    """Give ``key`` a new secret, save it, and return the secret: the only time it exists in clear."""
    secret = new_secret()
    key.digest = digest_of(secret)
    key.prefix = display_prefix(secret)
    key.full_clean()
    key.save()
    _changed()
    return secret


@transaction.atomic
def rotate_key(key: ApiKey) -> str:
    """Give ``key`` a new secret and return it (shown once): the old secret stops working as
    soon as the running server reads the change (at once in this process, within
    ``keys.runtime.POLL_S`` in others). Name, policy and history stay."""
    secret = new_secret()
    n = ApiKey.objects.filter(pk=key.pk).update(digest=digest_of(secret), prefix=display_prefix(secret), updated=timezone.now())
    if n != 1:
        raise ApiKey.DoesNotExist(f"no API key with id {key.pk}")
    key.digest, key.prefix = digest_of(secret), display_prefix(secret)
    _changed()
    return secret


@transaction.atomic
def save_key(key: ApiKey) -> ApiKey:
    """Save edits to an existing key (owner, notes, policy, expiry, revoked). Its name stays:
    files, batches, limits and the activity log go by it."""
    stored = ApiKey.objects.filter(pk=key.pk).values_list("name", flat=True).first()
    if stored is not None and stored != key.name:
        raise ValidationError({"name": f"A key cannot be renamed ({stored!r}): issue a new key instead."})
    return _save(key)


@transaction.atomic
def revoke_keys(keys: Iterable[ApiKey], revoked: bool = True) -> int:
    ids = [k.pk for k in keys]
    n = ApiKey.objects.filter(pk__in=ids).update(revoked=revoked, updated=timezone.now())
    _changed()
    return n


def delete_keys(keys: Iterable[ApiKey]) -> int:
    return _delete(ApiKey, keys)


# -- policies --------------------------------------------------------------------------


def save_policy(policy: KeyPolicy) -> KeyPolicy:
    return _save(policy)


def delete_policies(policies: Iterable[KeyPolicy]) -> int:
    """Raises ``ProtectedError`` while a key follows one of them: an admin key, or the static
    key (``SUPERFLUID_API_KEY``) through ``SUPERFLUID_API_KEY_POLICY``."""
    policies = list(policies)
    followed = static_key_policy()
    named = [p for p in policies if followed is not None and p.name == followed]
    if named:
        raise ProtectedError(
            f"Cannot delete key policy {followed!r}: the static key ({STATIC_KEY_NAME}) follows it (SUPERFLUID_API_KEY_POLICY).",
            set(named),
        )
    return _delete(KeyPolicy, policies)


# -- class-lane caps -------------------------------------------------------------------


def save_cap(cap: ClassLaneCap) -> ClassLaneCap:
    return _save(cap)


@transaction.atomic
def set_cap(qos_class: int, max_lanes: int, model: str = "") -> ClassLaneCap:
    """Create or change the cap for (model, class)."""
    cap = ClassLaneCap.objects.filter(model=model, qos_class=qos_class).first() or ClassLaneCap(model=model, qos_class=qos_class)
    cap.max_lanes = max_lanes
    return save_cap(cap)


def delete_caps(caps: Iterable[ClassLaneCap]) -> int:
    return _delete(ClassLaneCap, caps)
