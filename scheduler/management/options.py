"""Engine and scheduling flags shared by ``serve`` and ``runengine``, named as in the seed.

Every flag can also be set from an environment variable: ``--max-batch`` reads
``SUPERFLUID_MAX_BATCH``, and so on (flag name upper-cased, dashes to underscores).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from django.core.checks.registry import registry
from django.core.management.base import BaseCommand, CommandError

from scheduler.core.qos import QosClass, UnknownQosClass, parse_qos
from scheduler.core.scheduler import SchedulerConfig
from superfluid_site.env import EnvError, env_bool, env_float, env_int, env_str
from superfluid_site.serving import REASONING_FORMAT_VALUES


class FlagEnvError(CommandError, EnvError):
    """A serving flag's variable of the wrong type: a CommandError for the command, an EnvError
    for manage.py, which prints it as one line (it was raised while serve's parser was built,
    outside Django's own handling of CommandError: a traceback ended with it)."""


def _env(flag: str, default: Any, typ: type | None = None) -> Any:
    """The flag's environment variable, read as the flag's type (``typ``; else the type of its
    default) by superfluid_site.env: a float flag's variable takes ``0.5`` as the flag does."""
    name = "SUPERFLUID_" + flag.lstrip("-").upper().replace("-", "_")
    typ = typ or type(default)
    try:
        if typ is bool:
            return env_bool(name, default)
        if typ is float:
            return env_float(name, default)
        if typ is int:
            return env_int(name, default)
        return env_str(name, default)
    except EnvError as exc:
        raise FlagEnvError(f"environment value for {flag}: {exc}") from None


class FlagsCommand(BaseCommand):
    """A command whose flags the environment only defaults (serve, runengine, checkengine): the
    system checks that read the environment (``superfluid.*``, scheduler/checks.py) are left out
    of its start-up checks, since its own validation checks the same rules against the flags as
    given. They once stopped ``serve --max-batch 16`` with E001 for SUPERFLUID_CLASS_LANES=
    background=12 (checked against the variable's 8 lanes), and ``serve --model real.gguf`` with
    E002 for a stale SUPERFLUID_MODEL: the variable beat the flag."""

    def check(self, app_configs: Any = None, tags: Any = None, **kwargs: Any) -> None:
        if tags is None:
            tags = sorted(set(registry.tags_available()) - {"superfluid"})
        super().check(app_configs=app_configs, tags=tags, **kwargs)


# (flag, type, default, help) by --help section -- forwarded from serve to runengine as given
ENGINE_FLAG_GROUPS: dict[str, list[tuple[str, type, Any, str]]] = {
    "model and engine": [
        ("--model-name", str, "", "id the model is served under (default: the file name without extension)"),
        ("--engine", str, "auto", "auto (a .gguf file: llamacpp, an MLX model folder: mlx), llamacpp or mlx"),
        ("--max-batch", int, 8, "concurrent lanes (sequences) in the engine"),
        ("--ctx-size", int, 4096, "context tokens per lane"),
        ("--threads", int, 0, "CPU threads for the engine (0 = all cores)"),
        ("--adapt-threads", str, "on", "llama.cpp: use fewer threads than --threads while steps measure faster with fewer (busy cores): on or off"),
        ("--repack", str, "auto", "llama.cpp extra buffer types (AMX, weight repacking): auto (off where a build with AMX/AVX512 kernels meets a CPU with AMX), on or off"),
        ("--drain-timeout", int, 30, "seconds in-flight requests get to finish on SIGTERM"),
    ],
    "scheduling": [
        ("--class-lanes", str, "", "lane caps per class, e.g. background=2,agent=6 (each 1..--max-batch)"),
        ("--prefill-budget", int, 4096, "prompt tokens per tick across lanes, 64-4096; 0 = adaptive (256-4096)"),
        ("--tick-decode-budget", int, 0, "decode tokens per tick across lanes; 0 = every decoding lane"),
        ("--urgent-decode-share", int, 20, "an interactive or completion answer beside prefilling lanes decodes alone for this % of each prefill step's time, 0-100"),
        ("--abort-grace-ms", int, 300, "llama.cpp: an interactive or completion arrival lets a prompt step in flight finish when it is expected to within this time, instead of aborting it; 0 = abort at once, 0-10000"),
        ("--tick-target-ms", int, 2000, "tick duration while every lane is busy"),
        ("--starvation-ticks", int, 8, "starvation bound and queue aging period, in ticks"),
        ("--completion-deadline-ms", int, 0, "drop a completion-class job not started within this time; 0 = no deadline"),
        ("--stream-interval-ms", int, 50, "a running job's text goes to its client at most this often, several decode rounds' tokens in one event (its first token and its end at once); 0 = every round, 0-1000"),
        ("--aging-divisor", float, 60, "request priority: seconds of waiting per score point (a number, e.g. 0.5); 0 disables aging"),
        ("--swap-affinity-bonus", int, 10, "request priority: score bonus for the loaded model, 0-99"),
        ("--no-compact-lanes", bool, False, "llama.cpp: leave running jobs in their lanes, instead of moving one into a free lane so the busy lanes decode in one pass"),
    ],
    "prefix cache and memory": [
        ("--prefix-cache-slots", int, 4, "engine sequences holding cached prompt prefixes; 0 disables the prefix cache"),
        ("--pressure-high", int, 85, "KV pool occupancy (%) at which cached prefixes are evicted"),
        ("--pressure-low", int, 70, "KV pool occupancy (%) eviction stops at"),
        ("--host-cache-mb", int, 1024, "host memory for evicted prefixes, MiB; 0 drops them instead"),
        ("--os-pressure", str, "on", "react to OS memory pressure (/proc/pressure/memory): on or off"),
        ("--no-park", bool, False, "a preempted lane drops its KV and recomputes it when resumed, instead of parking it in host memory"),
    ],
}
ENGINE_FLAGS = [row for rows in ENGINE_FLAG_GROUPS.values() for row in rows]
ON_OFF_FLAGS = ("--adapt-threads", "--os-pressure")


def add_engine_arguments(parser: argparse.ArgumentParser, *, repeat_model: bool = False) -> None:
    groups = {title: parser.add_argument_group(title) for title in ENGINE_FLAG_GROUPS}
    engine = groups["model and engine"]
    if repeat_model:  # serve: several models, ids from the file names (or --config)
        env_model = _env("--model", "")  # SUPERFLUID_MODEL: one model, when no --model is given
        engine.add_argument("--model", action="append", default=None, help="model: a GGUF file or an MLX model folder, once or more; default: the bundled SmolLM2-135M-Instruct GGUF")
        parser.set_defaults(model_env=env_model)
    else:
        engine.add_argument("--model", default=_env("--model", ""), help="model: a GGUF file or an MLX model folder; default: the bundled SmolLM2-135M-Instruct GGUF")
    for title, flags in ENGINE_FLAG_GROUPS.items():
        for flag, typ, default, help_text in flags:
            if typ is bool:
                groups[title].add_argument(flag, action="store_true", default=_env(flag, default), help=_help(help_text))
                continue
            if flag in ON_OFF_FLAGS:  # their variables are booleans: 1/0, true/false, ... in any case
                value = "on" if _env(flag, default == "on", bool) else "off"
            elif flag == "--repack":
                value = _repack_env(default)
            else:
                value = _env(flag, default, typ)
            groups[title].add_argument(flag, type=typ, default=value, help=_help(f"{help_text} (default: {default!r})"))

    # llama-server's spelling; the last of --repack/--no-repack on the command line wins
    engine.add_argument("--no-repack", dest="repack", action="store_const", const="off", default=argparse.SUPPRESS, help="same as --repack off (as llama-server's --no-repack)")


def _repack_env(default: str) -> str:
    """``--repack``'s default from SUPERFLUID_REPACK (any case), or ``off`` from
    SUPERFLUID_NO_REPACK=1 (as ``--no-repack``); the two contradicting each other is refused."""
    value = _env("--repack", "", str).strip().lower()
    if _env("--no-repack", False):
        if value not in ("", "off"):
            raise FlagEnvError(f"SUPERFLUID_NO_REPACK=1 and SUPERFLUID_REPACK={value!r} contradict each other: unset one")
        return "off"
    return value or default


def _help(text: str) -> str:
    """argparse %-formats help strings: a literal % (as in "occupancy (%)") must be doubled."""
    return text.replace("%", "%%")


# (flag, type, default, help) -- the web side's admission bounds: serve only, not forwarded
WEB_FLAGS: list[tuple[str, type, Any, str]] = [
    ("--max-queue", int, 256, "requests waiting for a lane, per model; beyond it 503 with Retry-After (0 = no bound)"),
    ("--client-concurrency", int, 32, "requests in flight per keyless client address; beyond it 429 with Retry-After (0 = no bound)"),
]


def add_web_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, typ, default, help_text in WEB_FLAGS:
        parser.add_argument(flag, type=typ, default=_env(flag, default), help=_help(f"{help_text} (default: {default!r})"))


def check_web_options(options: dict[str, Any]) -> None:
    """Refuse a negative web bound (serve puts them into its ServingConfig)."""
    for flag, _typ, _default, _help_text in WEB_FLAGS:
        if options[flag.lstrip("-").replace("-", "_")] < 0:
            raise CommandError(f"{flag} must be 0 (no bound) or positive")


def check_bind_options(options: dict[str, Any]) -> None:
    """Refuse an address or port serve could not bind: daphne found out only after the database
    was migrated and the engine worker started, with a traceback."""
    if not str(options["host"]).strip():
        raise CommandError("--host (SUPERFLUID_HOST) must name an address, e.g. 127.0.0.1 or 0.0.0.0")
    if not 1 <= options["port"] <= 65535:
        raise CommandError(f"--port (SUPERFLUID_PORT) must be between 1 and 65535; got {options['port']}")


def add_fim_arguments(parser: argparse.ArgumentParser) -> None:
    """serve's --fim-model: a second resident model with its own lanes for fill-in-the-middle."""
    parser.add_argument("--fim-model", default=_env("--fim-model", ""), help="a GGUF file or an MLX model folder that serves fill-in-the-middle (/v1/completions with suffix) on its own lanes, resident beside the main model (default: none)")
    parser.add_argument("--fim-max-batch", type=int, default=_env("--fim-max-batch", 2), help="lanes of the --fim-model (default: 2)")
    parser.add_argument("--fim-max-context", type=int, default=_env("--fim-max-context", 0), help="context tokens per lane of the --fim-model, 64-8192 (default: 0 = --ctx-size, at most 8192)")


def add_api_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the web side's request parsing (serve only; the worker never sees them)."""
    switches = {
        "--strict-params": "answer parameters this server does not know with a 400 unknown_parameter, as OpenAI does, instead of ignoring them (named in x-superfluid-ignored-params)",
        "--no-prefill-assistant": "a chat whose last message is an assistant turn answers it with a new turn, as llama-server's flag; by default the reply continues that turn's text (a prefill)",
    }
    for flag, help_text in switches.items():
        parser.add_argument(flag, action="store_true", default=_env(flag, False), help=help_text)
    parser.add_argument(
        "--reasoning-format",
        choices=REASONING_FORMAT_VALUES,
        default=_env("--reasoning-format", "auto"),
        help="a reasoning model's reasoning (<think> blocks, gpt-oss's analysis channel) in chat replies, as llama-server's flag: auto, deepseek and deepseek-legacy put it in message.reasoning_content (delta.reasoning_content streamed), none leaves the reply's raw text in content (default: auto)",
    )
    parser.add_argument(
        "--sse-keepalive",
        type=float,
        default=_env("--sse-keepalive", 15, float),
        metavar="SECONDS",
        help="a stream that has sent nothing for this long (queued, reading a long prompt, parked) sends a keepalive: an SSE comment, "
        "a ping on /v1/messages, response.in_progress on /v1/responses; so proxies' and clients' idle timeouts do not cut it (0: none; else at least 1; default: 15)",
    )


def parse_class_lanes(text: str, max_batch: int) -> dict[QosClass, int]:
    caps: dict[QosClass, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise CommandError(f"--class-lanes entry {part!r} must look like class=N")
        try:
            qos = parse_qos(name)
            cap = int(value)
        except (UnknownQosClass, ValueError) as exc:
            raise CommandError(f"--class-lanes entry {part!r}: {exc}") from None
        if not 1 <= cap <= max_batch:
            raise CommandError(f"--class-lanes cap for {qos.label} must be between 1 and --max-batch ({max_batch}), got {cap}")
        caps[qos] = cap
    return caps


def resolve_model(options: dict[str, Any]) -> Path:
    from scheduler.engines.models import default_model_path

    path = Path(options["model"]).expanduser() if options.get("model") else default_model_path()
    if not path.exists():
        raise CommandError(f"--model {path}: no such file or directory")
    return path.resolve()


ENGINES = ("llamacpp", "mlx")


def choose_engine(kind: str, model: Path) -> str:
    """The engine for ``model`` under ``--engine kind``, or a CommandError that says why none fits."""
    from scheduler.engines.models import engine_for

    if kind not in ("auto", *ENGINES):
        raise CommandError(f"--engine must be auto, {' or '.join(ENGINES)}; got {kind!r}")
    found = engine_for(model)
    what = {"llamacpp": "a GGUF file", "mlx": "an MLX model folder (config.json and *.safetensors)"}
    if kind == "auto":
        if found is None:
            raise CommandError(f"--model {model}: not a GGUF file nor an MLX model folder (config.json and *.safetensors)")
        return found
    if kind == "llamacpp" and model.is_file():
        return kind  # llama.cpp itself says whether a file without the .gguf suffix is one
    if found != kind:
        hint = " (manage.py mlxconvert builds one from a GGUF file)" if kind == "mlx" else ""
        is_what = f"is {what[found]}" if found else "is neither"
        raise CommandError(f"--engine {kind} needs {what[kind]}{hint}; --model {model} {is_what}")
    return kind


MAX_CONTEXT_CELLS = 2**32 - 1  # llama_context_params.n_ctx is a uint32_t


def check_lanes_and_context(options: dict[str, Any], name: dict[str, str]) -> None:
    """``max_batch`` and ``ctx_size`` in their ranges; ``name``: what the errors call them."""
    if not 1 <= options["max_batch"] <= 64:
        raise CommandError(f"{name['max_batch']} must be between 1 and 64")
    if options["ctx_size"] < 64:
        raise CommandError(f"{name['ctx_size']} must be at least 64")


def scheduler_config(options: dict[str, Any], names: dict[str, str] | None = None) -> SchedulerConfig:
    """``names``: what the errors call ``ctx_size`` and ``max_batch`` where they did not come
    from the flags (a --config file's key, a FIM model's own flag)."""
    name = {"ctx_size": "--ctx-size", "max_batch": "--max-batch", **(names or {})}
    check_lanes_and_context(options, name)
    max_batch = options["max_batch"]
    if options["os_pressure"] not in ("on", "off"):
        raise CommandError("--os-pressure must be on or off")
    if options["adapt_threads"] not in ("on", "off"):
        raise CommandError(f"--adapt-threads must be on or off; got {options['adapt_threads']!r}")
    if options["repack"] not in ("auto", "on", "off"):
        raise CommandError(f"--repack must be auto, on or off; got {options['repack']!r}")
    if not 0 <= options["urgent_decode_share"] <= 100:
        raise CommandError(f"--urgent-decode-share must be between 0 and 100 (%); got {options['urgent_decode_share']}")
    if not 0 <= options["abort_grace_ms"] <= 10_000:
        raise CommandError(f"--abort-grace-ms must be between 0 and 10000; got {options['abort_grace_ms']}")
    if options["completion_deadline_ms"] < 0:
        raise CommandError("--completion-deadline-ms must be 0 (off) or positive")
    if not 0 <= options["stream_interval_ms"] <= 1000:
        raise CommandError(f"--stream-interval-ms must be between 0 (every round) and 1000; got {options['stream_interval_ms']}")
    # 0 has a documented meaning for each; a negative value used to mean the same without a word
    # (a negative --threads reached llama.cpp as is, and --drain-timeout -1 cut every stream at once)
    for flag, zero in (
        ("--threads", "all cores"),
        ("--starvation-ticks", "no starvation bound nor class aging"),
        ("--prefix-cache-slots", "no prefix cache"),
        ("--host-cache-mb", "evicted prefixes are dropped"),
        ("--drain-timeout", "in-flight requests are cut at once"),
    ):
        value = options[flag.lstrip("-").replace("-", "_")]
        if value < 0:
            raise CommandError(f"{flag} must be 0 ({zero}) or positive; got {value}")
    # every lane and cache slot is --ctx-size cells of one llama.cpp context, whose size is a
    # uint32: beyond it the size wrapped round to a small context that the lanes overran
    sequences = max_batch + options["prefix_cache_slots"]
    if options["ctx_size"] * sequences > MAX_CONTEXT_CELLS:
        raise CommandError(
            f"{name['ctx_size']} {options['ctx_size']} for {sequences} sequences ({name['max_batch']} lanes and --prefix-cache-slots) "
            f"is more than one context holds ({MAX_CONTEXT_CELLS} cells): lower {name['ctx_size']}"
        )
    if not 0 < options["pressure_low"] < options["pressure_high"] <= 100:
        # the flags are percentages: SchedulerConfig's own message speaks of fractions
        raise CommandError(
            f"--pressure-low and --pressure-high are percentages with 0 < low < high <= 100; "
            f"got --pressure-low {options['pressure_low']} --pressure-high {options['pressure_high']}"
        )
    try:
        return SchedulerConfig(
            max_batch=max_batch,
            lane_ctx=options["ctx_size"],
            class_lanes=parse_class_lanes(options["class_lanes"], max_batch),
            prefill_budget=options["prefill_budget"],
            tick_decode_budget=options["tick_decode_budget"],
            urgent_decode_share=options["urgent_decode_share"] / 100,
            abort_grace_s=options["abort_grace_ms"] / 1000,
            tick_target_ms=options["tick_target_ms"],
            starvation_ticks=options["starvation_ticks"],
            prefix_cache=options["prefix_cache_slots"] > 0,
            cache_slots=max(0, options["prefix_cache_slots"]),
            pressure_high=options["pressure_high"] / 100,
            pressure_low=options["pressure_low"] / 100,
            host_cache_bytes=max(0, options["host_cache_mb"]) << 20,
            aging_divisor_s=float(options["aging_divisor"]),
            swap_affinity_bonus=options["swap_affinity_bonus"],
            park=not options.get("no_park", False),
            compact_lanes=not options.get("no_compact_lanes", False),
        )
    except ValueError as exc:
        # SchedulerConfig names its fields; the operator wrote flags
        # (a field is its flag's option name, or that in seconds: aging_divisor_s)
        message = str(exc)
        for flag, *_ in ENGINE_FLAGS:
            name = flag.lstrip("-").replace("-", "_")
            field_name = next((f for f in (name, name + "_s") if message.startswith(f + " ")), None)
            if field_name is not None:
                message = f"{flag} {message[len(field_name) + 1 :]}; got {options[name]}"
                break
        raise CommandError(message) from None


def engine_argv(options: dict[str, Any], model: Path) -> list[str]:
    """The runengine flags that reproduce these options."""
    argv = ["--model", str(model)]
    for flag, typ, _default, _help in ENGINE_FLAGS:
        value = options[flag.lstrip("-").replace("-", "_")]
        if typ is bool:
            argv += [flag] if value else []
        else:
            argv += [flag, str(value)]
    return argv
