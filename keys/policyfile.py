"""``--key-policy FILE``: key policies and keys kept in a JSON file beside the admin's.

The file is read when ``serve`` starts (a bad file stops it with a message before anything
starts) and its keys join every snapshot the admin's database gives; a key in the database with
the same digest wins. Secrets are never in the file, only their SHA-256 digests
(``python -c "import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())" SECRET``)::

    {
      "policies": [
        {"name": "ci", "default_class": "background", "max_class": "agent",
         "rate_limit_rpm": 60, "max_concurrent": 2, "priority_offset": 0,
         "allowed_models": [], "allow_batch_invariant": false,
         "share_prefix_cache": false, "allow_pin_prefix": false, "is_admin": false}
      ],
      "keys": [{"name": "ci-bot", "sha256": "<64 hex digits>", "policy": "ci"}]
    }

Every policy field but ``name`` is optional (defaults as in the admin); a key's ``policy`` may be
left out (the server's defaults then apply).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from scheduler.core.qos import QosClass, UnknownQosClass, parse_qos
from superfluid_site.serving import serving

from .snapshot import RESERVED_KEY_NAMES, Key, Policy

MAX_PRIORITY_OFFSET = 39  # keys.models.MAX_PRIORITY_OFFSET, without importing the models
# keys.models.MAX_LIMIT: the most rate_limit_rpm and max_concurrent may be, as in the admin. A
# number beyond a float's range (JSON has no bound) failed every request of the policy's keys
# with a 500 when admission divided it into a refill rate.
MAX_LIMIT = 2**31 - 1
# the admin's longest key and policy name (ApiKey.name, KeyPolicy.name): what goes by a key's name
# holds no more (the activity log cuts it at 200, a batch file's owner column refuses more)
MAX_NAME_CHARS = 100
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_POLICY_FIELDS = {
    "name", "default_class", "max_class", "rate_limit_rpm", "max_concurrent", "priority_offset",
    "allowed_models", "allow_batch_invariant", "share_prefix_cache", "allow_pin_prefix", "is_admin",
}


class PolicyFileError(ValueError):
    pass


def _policy(raw: Any, where: str) -> Policy:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise PolicyFileError(f"{where}: a policy needs a non-empty \"name\"")
    _check_name_length(raw["name"], where)
    unknown = set(raw) - _POLICY_FIELDS
    if unknown:
        raise PolicyFileError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    try:
        default = parse_qos(str(raw.get("default_class", "agent")))
        best = parse_qos(str(raw.get("max_class", default.label)))
    except UnknownQosClass as exc:
        raise PolicyFileError(f"{where}: {exc}") from None
    if best > default:
        raise PolicyFileError(f"{where}: max_class ({best.label}) must be at least as good as default_class ({default.label})")
    ints = {}
    for name in ("rate_limit_rpm", "max_concurrent", "priority_offset"):
        value = raw.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            raise PolicyFileError(f"{where}: {name} must be an integer")
        ints[name] = value
    if not (0 <= ints["rate_limit_rpm"] <= MAX_LIMIT and 0 <= ints["max_concurrent"] <= MAX_LIMIT):
        raise PolicyFileError(f"{where}: rate_limit_rpm and max_concurrent must be between 0 and {MAX_LIMIT}")
    if abs(ints["priority_offset"]) > MAX_PRIORITY_OFFSET:
        raise PolicyFileError(f"{where}: priority_offset must be between -{MAX_PRIORITY_OFFSET} and {MAX_PRIORITY_OFFSET}")
    models = raw.get("allowed_models", [])
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise PolicyFileError(f"{where}: allowed_models must be a list of model ids")
    models = [m.strip() for m in models]  # as the admin's list reads them (Policy.model_list)
    for j, m in enumerate(models):
        if not m:  # allowed no model at all; the admin reads a blank list as all of them
            raise PolicyFileError(f"{where}: allowed_models[{j}] is blank; leave the list empty ([]) to allow every model")
    flags = {}
    for name in ("allow_batch_invariant", "share_prefix_cache", "allow_pin_prefix", "is_admin"):
        value = raw.get(name, False)
        if not isinstance(value, bool):
            raise PolicyFileError(f"{where}: {name} must be true or false")
        flags[name] = value
    return Policy(name=raw["name"], default_class=default, max_class=QosClass(best), allowed_models=tuple(models), **ints, **flags)


def _check_name_length(name: str, where: str) -> None:
    if len(name) > MAX_NAME_CHARS:
        raise PolicyFileError(f"{where}: a name may have at most {MAX_NAME_CHARS} characters (as in the admin), not {len(name)}")


def _unique_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a name given twice in it (json.loads keeps the last silently: a
    second "keys" list dropped the first's keys, a field given twice had its first value ignored)."""
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise PolicyFileError(f"{name!r} is given twice in one object")
        out[name] = value
    return out


def _check_encodable(value: Any, where: str) -> None:
    """Every string (keys too) must be Unicode text: a lone surrogate (``"\\ud800"``) would
    break /metrics, the dashboard and the logs that show the names later. Nor may one hold
    U+0000, which the admin refuses too: PostgreSQL stores no such text, so the activity rows
    and batch files of a key named with one were refused there."""
    stack = [(where, value)]
    while stack:
        path, item = stack.pop()
        texts = [item] if isinstance(item, str) else list(item) if isinstance(item, dict) else []
        for text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise PolicyFileError(f"{path}: a string holds a lone surrogate ({text[:40]!r}); strings must be valid Unicode text") from None
            if "\x00" in text:
                raise PolicyFileError(f"{path}: a string holds U+0000 ({text[:40]!r}); null characters are not allowed (as in the admin)")
        if isinstance(item, dict):
            stack.extend((f"{path}.{k}" if path != "the file" else k, v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(item))


class FileKeys(dict[str, Key]):
    """The file's keys by digest, and its policies by name (``policies``): a policy that no key
    of the file follows is still one ``SUPERFLUID_API_KEY_POLICY`` may name."""

    def __init__(self, keys: dict[str, Key], policies: dict[str, Policy]) -> None:
        super().__init__(keys)
        self.policies = policies


def parse_policy_file(text: str) -> FileKeys:
    """Keys by digest, from the file's text; PolicyFileError says what is wrong and where."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_fields)
    except PolicyFileError:
        raise
    except RecursionError:
        raise PolicyFileError("not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer longer than int() converts
        raise PolicyFileError(f"not valid JSON: {exc}") from None
    _check_encodable(data, "the file")
    if not isinstance(data, dict) or set(data) - {"policies", "keys"}:
        raise PolicyFileError('the file must be an object with "policies" and "keys"')
    for section in ("policies", "keys"):
        if not isinstance(data.get(section, []), list):
            raise PolicyFileError(f'"{section}" must be a list')
    policies: dict[str, Policy] = {}
    for i, raw in enumerate(data.get("policies", [])):
        policy = _policy(raw, f"policies[{i}]")
        if policy.name in policies:
            raise PolicyFileError(f"policies[{i}]: a second policy named {policy.name!r}")
        policies[policy.name] = policy
    keys: dict[str, Key] = {}
    names: set[str] = set()
    for i, raw in enumerate(data.get("keys", [])):
        where = f"keys[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
            raise PolicyFileError(f"{where}: a key needs a non-empty \"name\"")
        _check_name_length(raw["name"], where)
        if set(raw) - {"name", "sha256", "policy"}:
            raise PolicyFileError(f"{where}: unknown field(s) {', '.join(sorted(set(raw) - {'name', 'sha256', 'policy'}))}")
        digest = raw.get("sha256", "")
        digest = digest.lower() if isinstance(digest, str) else ""
        if not _DIGEST.fullmatch(digest):
            raise PolicyFileError(f"{where}: sha256 must be the 64 hex digits of the secret's SHA-256")
        policy_name = raw.get("policy")
        if policy_name is not None and (not isinstance(policy_name, str) or policy_name not in policies):
            raise PolicyFileError(f"{where}: no policy named {policy_name!r} in the file")
        if raw["name"] in RESERVED_KEY_NAMES:
            raise PolicyFileError(f"{where}: {raw['name']!r} is a reserved name (the environment's static key, or keyless requests in /metrics and the logs)")
        if raw["name"] in names or digest in keys:
            raise PolicyFileError(f"{where}: a second key named {raw['name']!r} or with the same digest")
        names.add(raw["name"])
        # negative ids: never a database row (last-used times are not recorded for them)
        keys[digest] = Key(id=-(i + 1), name=raw["name"], digest=digest, policy=policies.get(policy_name) if policy_name else None)
    return FileKeys(keys, policies)


_loaded: dict[str, FileKeys] = {}


def file_keys() -> FileKeys:
    """The keys of serve's ``--key-policy`` file (``serving().key_policy_file``) (empty without one), read once."""
    path = serving().key_policy_file
    if not path:
        return FileKeys({}, {})
    if path not in _loaded:
        _loaded[path] = load_policy_file(path)
    return _loaded[path]


def load_policy_file(path: str | Path) -> FileKeys:
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a BOM (Notepad, PowerShell) is no part of the JSON
    except OSError as exc:
        raise PolicyFileError(f"cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PolicyFileError(f"not UTF-8 text (at byte {exc.start})") from None
    return parse_policy_file(text)
