"""Which models one server holds: ``serve --config superfluid.yaml``, or ``--model`` given once or
more. Free of Django; a bad file is a :class:`ConfigError` naming the file, line and key.

The file's shape (llama-swap's, plus superfluid's per-model lanes)::

    models:
      smol:
        model: /path/to/SmolLM2-135M-Instruct.Q4_1.gguf   # a GGUF file or an MLX folder
        aliases: [small]
        max_batch: 8          # lanes, as --max-batch
        ctx_size: 4096        # per lane, as --ctx-size
        ttl: 300              # seconds idle before unloading; 0 = never, -1 = globalTTL
        priority: 0           # the fifo scheduler's per-model priority
    max_loaded_models: 1
    hooks:
      on_startup:
        preload: [smol]       # loaded as serve starts
    globalTTL: 0              # a model's ttl when it gives none (or -1)
    healthCheckTimeout: 120   # seconds a model's worker has to be ready
    routing:
      scheduler:
        use: serial           # or fifo
        settings:
          serial:
            agingDivisor: 60
            swapAffinityBonus: 10
          fifo:
            priority: {smol: 0}   # llama-swap's form of models.<id>.priority

A relative ``model`` path is taken from the file's folder.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scheduler.core.router import SCHEDULERS, ModelSpec, RouterConfig

MAX_BATCH_LIMIT = 64
MIN_CTX = 64
FIM_MAX_CONTEXT = 8192  # --fim-max-context's bound (scheduling seed: "up to 8192")
# llama-swap's healthCheckTimeout: seconds a model's worker has to be ready (model loaded, its
# start-up decode done) before its load counts as failed; its default and its minimum
LOAD_TIMEOUT_S = 120.0
MIN_LOAD_TIMEOUT_S = 15.0


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ServedModel:
    id: str
    path: Path
    aliases: tuple[str, ...] = ()
    max_batch: int | None = None  # None: the --max-batch flag
    ctx_size: int | None = None  # None: the --ctx-size flag
    ttl_s: float = 0.0
    priority: int = 0
    fim: bool = False  # serve --fim-model: fill-in-the-middle goes here; resident from the start

    def spec(self) -> ModelSpec:
        return ModelSpec(self.id, priority=self.priority, ttl_s=self.ttl_s, pinned=self.fim)


@dataclass(frozen=True)
class ModelsConfig:
    models: tuple[ServedModel, ...]
    max_loaded_models: int = 1
    scheduler: str = "serial"
    aging_divisor_s: float = 60.0
    swap_affinity_bonus: int = 10
    preload: tuple[str, ...] = ()  # loaded at start (one --model: today's behaviour)
    load_timeout_s: float = LOAD_TIMEOUT_S  # healthCheckTimeout: a load not ready by then fails
    source: str = ""  # the file, for messages
    names: dict[str, str] = field(default_factory=dict)  # id or alias -> id

    def __post_init__(self) -> None:
        if not self.names:
            object.__setattr__(self, "names", _names(self.models))

    def router_config(self) -> RouterConfig:
        return RouterConfig(self.max_loaded_models, self.scheduler, self.aging_divisor_s, self.swap_affinity_bonus)

    def resolve(self, name: str) -> str | None:
        """The model id a request's ``model`` names (an id or an alias), or None."""
        return self.names.get(name)

    def get(self, model_id: str) -> ServedModel:
        return next(m for m in self.models if m.id == model_id)

    @property
    def fim_model(self) -> str | None:
        """The id of the ``--fim-model``, if there is one."""
        return next((m.id for m in self.models if m.fim), None)

    def route(self, model_id: str, *, fim: bool) -> str:
        """The model a request runs on: a fill-in-the-middle request (one with ``suffix``) on the
        ``--fim-model`` whatever model it names; everything else on the model it names."""
        return (self.fim_model or model_id) if fim else model_id


def _names(models: Sequence[ServedModel]) -> dict[str, str]:
    names: dict[str, str] = {}
    for m in models:
        for name in (m.id, *m.aliases):
            if name in names and names[name] != m.id:
                raise ConfigError(f"model name {name!r} is used by both {names[name]!r} and {m.id!r}")
            names[name] = m.id
    return names


def from_model_paths(paths: Sequence[Path], name_for: Callable[[Path], str], *, model_name: str = "", aging_divisor_s: float = 60.0, swap_affinity_bonus: int = 10) -> ModelsConfig:
    """``--model`` given once (today's server: loaded at start, never unloaded) or more (ids from the
    file names, loaded on demand, one at a time)."""
    if model_name and len(paths) > 1:
        raise ConfigError("--model-name names a single --model; with several, ids come from the file names (or use --config)")
    models = [ServedModel(model_name or name_for(p), p) for p in paths]
    ids = [m.id for m in models]
    for mid in ids:
        if ids.count(mid) > 1:
            raise ConfigError(f"two --model files would both be served as {mid!r}; rename one or use --config")
    return ModelsConfig(
        tuple(models),
        aging_divisor_s=aging_divisor_s,
        swap_affinity_bonus=swap_affinity_bonus,
        preload=(ids[0],) if len(ids) == 1 else (),
    )


def with_fim_model(cfg: ModelsConfig, path: Path, name_for: Callable[[Path], str], *, max_batch: int, max_context: int) -> ModelsConfig:
    """``--fim-model PATH``: ``cfg`` plus a model for fill-in-the-middle with its own lanes
    (``--fim-max-batch``) and per-lane context (``--fim-max-context``, up to 8192), loaded at start
    beside the others and never swapped out. Its id is the file name, made unique with a
    ``-fim`` suffix (and a number) where a configured id or alias has it already."""
    if not 1 <= max_batch <= MAX_BATCH_LIMIT:
        raise ConfigError(f"--fim-max-batch must be between 1 and {MAX_BATCH_LIMIT}, got {max_batch}")
    if not MIN_CTX <= max_context <= FIM_MAX_CONTEXT:
        raise ConfigError(f"--fim-max-context must be between {MIN_CTX} and {FIM_MAX_CONTEXT}, got {max_context}")
    base = name_for(path)
    candidates = itertools.chain([base, f"{base}-fim"], (f"{base}-fim-{n}" for n in itertools.count(2)))
    fim_id = next(c for c in candidates if c not in cfg.names)
    fim = ServedModel(fim_id, path, max_batch=max_batch, ctx_size=max_context, fim=True)
    return dataclasses.replace(cfg, models=(*cfg.models, fim), preload=(*cfg.preload, fim_id), names={})


# -- the YAML file -----------------------------------------------------------------------------


class _Where:
    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, node: yaml.Node | None, key: str, message: str) -> ConfigError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        # the file's top level has no key name: say what it should be (it read ": must be a mapping")
        what = key or f"the file (a mapping of {', '.join(TOP_KEYS)})"
        return ConfigError(f"{self.source}{line}: {what}: {message}")


_MERGE = "tag:yaml.org,2002:merge"


def _mapping(where: _Where, node: yaml.Node, key: str, _merging: frozenset[int] = frozenset()) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """A mapping's keys and values. A merge key (``<<: *base``, or ``<<: [*a, *b]``) brings in the
    keys of the mappings it names, as yaml.v3 (llama-swap) reads it: a key the mapping gives
    itself wins, and among the merged mappings the first that has a key."""
    if not isinstance(node, yaml.MappingNode):
        raise where.error(node, key, "must be a mapping")
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    merged: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.tag == _MERGE:
            sources = v.value if isinstance(v, yaml.SequenceNode) else [v]
            for src in sources:
                if not isinstance(src, yaml.MappingNode) or id(src) in _merging or src is node:
                    raise where.error(src, f"{key}.<<" if key else "<<", "must be a mapping (or a list of mappings) other than the one it is in")
                for name, pair in _mapping(where, src, key, _merging | {id(node)}).items():
                    merged.setdefault(name, pair)
            continue
        if not isinstance(k, yaml.ScalarNode) or not k.value:
            raise where.error(k, key, "keys must be plain names")
        name = f"{key}.{k.value}" if key else k.value
        if k.value in out:
            raise where.error(k, name, "is given twice")
        out[k.value] = (k, v)
    for name, pair in merged.items():
        out.setdefault(name, pair)
    return out


def _only(where: _Where, found: dict[str, tuple[yaml.Node, yaml.Node]], key: str, allowed: Sequence[str]) -> None:
    for name, (k, _v) in found.items():
        if name not in allowed:
            full = f"{key}.{name}" if key else name
            raise where.error(k, full, f"unknown key (expected one of {', '.join(allowed)})")


# The file is read as llama-swap (Go, gopkg.in/yaml.v3) reads it: YAML 1.2, where PyYAML reads YAML
# 1.1 (``no`` false, ``1:08:16`` 4096 in base 60, ``0o10`` and ``3e2`` strings). A plain value is a
# boolean only as true or false, null as ~, null or nothing, an integer in decimal, 0x, 0o or 0b, a
# float in decimal (``1.5``, ``3e2``), .inf or .nan; anything else is a string. In a number that
# starts with a digit or a sign, yaml.v3 drops every ``_`` before reading it (``32_768``,
# ``1_000.5``, ``-_1``); one that starts with ``.`` has none. A decimal integer with a leading zero
# (``010``) is refused: octal 8 to llama-swap, 10 to YAML 1.2.
_SIGN = r"(?:[-+]_*)?"
_EXP = r"(?:[eE]_*[-+]?_*[0-9][0-9_]*)"
_INT = rf"{_SIGN}(?:[0-9][0-9_]*|0_*[xX][0-9a-fA-F_]+|0_*[oO][0-7_]+|0_*[bB][01_]+)"
_FLOAT = (
    rf"{_SIGN}[0-9][0-9_]*(?:\.[0-9_]*)?{_EXP}?|[-+]_*\._*[0-9][0-9_]*{_EXP}?|\.[0-9]+(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)
_YAML12 = {
    "bool": r"true|True|TRUE|false|False|FALSE",
    "null": r"~|null|Null|NULL|",
    "int": _INT,  # before float, whose pattern takes decimal integers too
    "float": _FLOAT,
}
_LEADING_ZERO = re.compile(r"[-+]?0[0-9]+")
# a name or path is the text written, whatever it would read as elsewhere (a model ``8``, an alias
# ``1:30`` or ``true``, a file ``1.50``), as llama-swap reads a string
_AS_WRITTEN = {f"tag:yaml.org,2002:{kind}" for kind in ("bool", "int", "float")}


class _Yaml12Loader(yaml.SafeLoader):
    yaml_implicit_resolvers: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}  # YAML 1.1's left out


for _kind, _pattern in _YAML12.items():
    _Yaml12Loader.add_implicit_resolver(f"tag:yaml.org,2002:{_kind}", re.compile(rf"(?:{_pattern})\Z"), None)
_Yaml12Loader.add_implicit_resolver(_MERGE, re.compile(r"<<\Z"), ["<"])  # yaml.v3 merges as YAML 1.1 did


class _Yaml12Constructor(yaml.constructor.SafeConstructor):
    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = str(self.construct_scalar(node)).replace("_", "")
        if _LEADING_ZERO.fullmatch(digits):
            raise ValueError(f"{node.value} has a leading zero, octal to llama-swap and decimal to YAML 1.2: write it without the zero for decimal, or with 0o for octal (0o10 is 8)")
        return int(digits, 0)  # decimal, 0x, 0o or 0b; base 60 (1:30) is no integer

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        if ":" in str(self.construct_scalar(node)):
            raise ValueError(f"{node.value} is no number to YAML 1.2 (base 60 was YAML 1.1's)")
        return float(super().construct_yaml_float(node))


_Yaml12Constructor.add_constructor("tag:yaml.org,2002:int", _Yaml12Constructor.construct_yaml_int)
_Yaml12Constructor.add_constructor("tag:yaml.org,2002:float", _Yaml12Constructor.construct_yaml_float)


def _scalar(where: _Where, node: yaml.Node, key: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise where.error(node, key, "must be a single value")
    try:  # constructed as it is: written out and read again, an empty value (``ttl:``) was no YAML
        return _Yaml12Constructor().construct_object(node)
    except (yaml.YAMLError, ValueError) as exc:
        raise where.error(node, key, f"cannot be read: {str(exc).splitlines()[0]}") from None


def _int(where: _Where, node: yaml.Node, key: str, low: int | None = None, high: int | None = None) -> int:
    value = _scalar(where, node, key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise where.error(node, key, f"must be an integer, got {node.value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise where.error(node, key, f"must be {bounds}, got {value}")
    return value


def _number(where: _Where, node: yaml.Node, key: str, low: float = 0.0) -> float:
    value = _scalar(where, node, key)  # 3e2 too, as YAML 1.2 reads it; a quoted "3e2" is a string
    try:  # an integer too large for a float overflowed here with a traceback
        finite = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite:
        raise where.error(node, key, f"must be a finite number, got {node.value!r}")
    if value < low:
        raise where.error(node, key, f"must be {low:g} or more, got {value}")
    return float(value)


def _str(where: _Where, node: yaml.Node, key: str) -> str:
    value = node.value if isinstance(node, yaml.ScalarNode) and node.tag in _AS_WRITTEN else _scalar(where, node, key)
    if not isinstance(value, str) or not value.strip():
        raise where.error(node, key, f"must be a non-empty string, got {node.value!r}")
    if not _is_text(value):
        raise where.error(node, key, f"{value!r} holds a lone surrogate; strings must be valid Unicode text")
    return value.strip()


def _is_text(name: str) -> bool:
    """Whether ``name`` is Unicode text: a lone surrogate (``"\\ud800"``) in a model's id or alias
    made /metrics, which labels each model with them, fail with UnicodeEncodeError (every string
    of the file is held to it, as the --key-policy file's are)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


MODEL_KEYS = ("model", "aliases", "max_batch", "ctx_size", "ttl", "priority")
TOP_KEYS = ("models", "max_loaded_models", "globalTTL", "healthCheckTimeout", "routing", "hooks")


def _model(where: _Where, mid: str, node: yaml.Node, base: Path, check_path: Callable[[Path], str | None], global_ttl: float = 0.0) -> ServedModel:
    key = f"models.{mid}"
    fields = _mapping(where, node, key)
    _only(where, fields, key, MODEL_KEYS)
    if "model" not in fields:
        raise where.error(node, f"{key}.model", "is required (a GGUF file or an MLX model folder)")
    path_node = fields["model"][1]
    path = Path(_str(where, path_node, f"{key}.model")).expanduser()
    if not path.is_absolute():
        path = base / path
    problem = check_path(path)
    if problem:
        raise where.error(path_node, f"{key}.model", problem)
    aliases: list[str] = []
    if "aliases" in fields:
        anode = fields["aliases"][1]
        if not isinstance(anode, yaml.SequenceNode):
            raise where.error(anode, f"{key}.aliases", "must be a list of names")
        aliases = [_str(where, a, f"{key}.aliases") for a in anode.value]
        for i, alias in enumerate(aliases):  # /v1/models listed a name twice
            if alias == mid or alias in aliases[:i]:
                raise where.error(anode.value[i], f"{key}.aliases", f"{alias!r} is already a name of {mid!r}")
    kw: dict[str, Any] = {"ttl_s": global_ttl}
    if "max_batch" in fields:
        kw["max_batch"] = _int(where, fields["max_batch"][1], f"{key}.max_batch", 1, MAX_BATCH_LIMIT)
    if "ctx_size" in fields:
        kw["ctx_size"] = _int(where, fields["ctx_size"][1], f"{key}.ctx_size", MIN_CTX)
    if "ttl" in fields:
        # llama-swap's -1 (its default) is the file's globalTTL
        ttl = _number(where, fields["ttl"][1], f"{key}.ttl", -math.inf)
        if ttl < 0 and ttl != -1:
            raise where.error(fields["ttl"][1], f"{key}.ttl", f"must be 0 or more (or -1: globalTTL), got {_scalar(where, fields['ttl'][1], key)}")
        kw["ttl_s"] = global_ttl if ttl == -1 else ttl
    if "priority" in fields:
        kw["priority"] = _int(where, fields["priority"][1], f"{key}.priority")
    return ServedModel(mid, path.resolve(), tuple(aliases), **kw)


def _default_check(path: Path) -> str | None:
    return None if path.exists() else f"no such file or directory: {path}"


def parse_config(text: str, source: str = "<config>", base: Path | None = None, check_path: Callable[[Path], str | None] = _default_check) -> ModelsConfig:
    where = _Where(source)
    try:
        root = yaml.compose(text, Loader=_Yaml12Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}{line}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ConfigError(f"{source}: not valid YAML: nested too deeply") from None
    if root is None:
        raise ConfigError(f"{source}: models: is required (the file is empty)")
    top = _mapping(where, root, "")
    _only(where, top, "", TOP_KEYS)
    if "models" not in top:
        raise where.error(root, "models", "is required")
    models_node = top["models"][1]
    entries = _mapping(where, models_node, "models")
    if not entries:
        raise where.error(models_node, "models", "names no model")
    base = base or Path.cwd()
    for mid, (k, _v) in entries.items():
        if not _is_text(mid):
            raise where.error(k, "models", f"model id {mid!r} holds a lone surrogate; names must be valid Unicode text")
    global_ttl = _number(where, top["globalTTL"][1], "globalTTL") if "globalTTL" in top else 0.0
    models = [_model(where, mid, v, base, check_path, global_ttl) for mid, (_k, v) in entries.items()]
    try:
        names = _names(models)
    except ConfigError as exc:
        raise where.error(models_node, "models", str(exc)) from None
    kw: dict[str, Any] = {}
    if "max_loaded_models" in top:
        kw["max_loaded_models"] = _int(where, top["max_loaded_models"][1], "max_loaded_models", 1)
    if "healthCheckTimeout" in top:
        # below 15 (0 and negatives too) is 15, as llama-swap raises it: its files start here too
        kw["load_timeout_s"] = max(MIN_LOAD_TIMEOUT_S, _number(where, top["healthCheckTimeout"][1], "healthCheckTimeout", -math.inf))
    if "hooks" in top:
        kw["preload"] = _preload(where, top["hooks"][1], names)
    if "routing" in top:
        routing = _mapping(where, top["routing"][1], "routing")
        _only(where, routing, "routing", ("scheduler",))
        if "scheduler" in routing:
            sched = _mapping(where, routing["scheduler"][1], "routing.scheduler")
            _only(where, sched, "routing.scheduler", ("use", "settings"))
            if "use" in sched:
                use = _str(where, sched["use"][1], "routing.scheduler.use")
                if use not in SCHEDULERS:
                    raise where.error(sched["use"][1], "routing.scheduler.use", f"must be serial or fifo, got {use!r}")
                kw["scheduler"] = use
            if "settings" in sched:
                settings = _mapping(where, sched["settings"][1], "routing.scheduler.settings")
                _only(where, settings, "routing.scheduler.settings", ("serial", "fifo"))
                if "fifo" in settings:
                    given = {mid for mid, (_k, v) in entries.items() if "priority" in _mapping(where, v, f"models.{mid}")}
                    models = _fifo_priorities(where, settings["fifo"][1], models, names, given)
                if "serial" in settings:
                    key = "routing.scheduler.settings.serial"
                    serial = _mapping(where, settings["serial"][1], key)
                    _only(where, serial, key, ("agingDivisor", "swapAffinityBonus"))
                    if "agingDivisor" in serial:
                        kw["aging_divisor_s"] = _number(where, serial["agingDivisor"][1], f"{key}.agingDivisor")
                    if "swapAffinityBonus" in serial:
                        kw["swap_affinity_bonus"] = _int(where, serial["swapAffinityBonus"][1], f"{key}.swapAffinityBonus", 0, 99)
    return ModelsConfig(tuple(models), source=source, names=names, **kw)


def _preload(where: _Where, node: yaml.Node, names: dict[str, str]) -> tuple[str, ...]:
    """llama-swap's ``hooks.on_startup.preload``: models (ids or aliases) loaded as serve starts,
    as the admin's Load loads them (into a free slot, or in place of an idle model)."""
    hooks = _mapping(where, node, "hooks")
    _only(where, hooks, "hooks", ("on_startup",))
    if "on_startup" not in hooks:
        return ()
    key = "hooks.on_startup"
    startup = _mapping(where, hooks["on_startup"][1], key)
    _only(where, startup, key, ("preload",))
    if "preload" not in startup:
        return ()
    pnode = startup["preload"][1]
    if not isinstance(pnode, yaml.SequenceNode):
        raise where.error(pnode, f"{key}.preload", "must be a list of model names")
    out: list[str] = []
    for item in pnode.value:
        name = _str(where, item, f"{key}.preload")
        mid = names.get(name)
        if mid is None:
            raise where.error(item, f"{key}.preload", f"names no configured model: {name!r}")
        if mid not in out:
            out.append(mid)
    return tuple(out)


def _fifo_priorities(where: _Where, node: yaml.Node, models: list[ServedModel], names: dict[str, str], written: set[str]) -> list[ServedModel]:
    """llama-swap's ``routing.scheduler.settings.fifo.priority``: a mapping of model (id or alias)
    to the fifo scheduler's per-model priority, the same number as ``models.<id>.priority``."""
    key = "routing.scheduler.settings.fifo"
    fifo = _mapping(where, node, key)
    _only(where, fifo, key, ("priority",))
    if "priority" not in fifo:
        return models
    given: dict[str, str] = {}  # model id -> the name its priority was given under
    priority: dict[str, int] = {}
    for name, (k, v) in _mapping(where, fifo["priority"][1], f"{key}.priority").items():
        mid = names.get(name)
        if mid is None:
            raise where.error(k, f"{key}.priority", f"names no configured model: {name!r}")
        if mid in given:
            raise where.error(k, f"{key}.priority", f"{name!r} and {given[mid]!r} both name model {mid!r}")
        given[mid] = name
        priority[mid] = _int(where, v, f"{key}.priority.{name}")
    out = []
    for m in models:
        if m.id in priority and m.id in written and m.priority != priority[m.id]:
            raise where.error(fifo["priority"][1], f"{key}.priority.{given[m.id]}", f"model {m.id!r} has priority {m.priority} in models.{m.id}.priority already")
        out.append(dataclasses.replace(m, priority=priority[m.id]) if m.id in priority else m)
    return out


def load_config(path: Path, check_path: Callable[[Path], str | None] = _default_check) -> ModelsConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: {exc}") from None
    return parse_config(text, str(path), path.resolve().parent, check_path)
