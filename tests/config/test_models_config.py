"""serve --config: the YAML shape, and a bad file named by line and key before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.models_config import ConfigError, from_model_paths, load_config, parse_config, with_fim_model

GOOD = """\
models:
  smol:
    model: smol.gguf
    aliases: [small, tiny]
    max_batch: 4
    ctx_size: 2048
    ttl: 300
    priority: 10
  other:
    model: other.gguf
max_loaded_models: 2
healthCheckTimeout: 600
routing:
  scheduler:
    use: fifo
    settings:
      serial:
        agingDivisor: 30
        swapAffinityBonus: 0
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "smol.gguf").write_bytes(b"GGUF")
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    return tmp_path


def write(folder: Path, text: str) -> Path:
    path = folder / "superfluid.yaml"
    path.write_text(text)
    return path


def test_the_issues_shape_is_read_with_every_setting(folder: Path) -> None:
    cfg = load_config(write(folder, GOOD))
    smol, other = cfg.models
    assert (smol.id, smol.path, smol.aliases) == ("smol", folder / "smol.gguf", ("small", "tiny"))
    assert (smol.max_batch, smol.ctx_size, smol.ttl_s, smol.priority) == (4, 2048, 300.0, 10)
    assert (other.max_batch, other.ctx_size, other.ttl_s, other.priority) == (None, None, 0.0, 0)
    assert (cfg.max_loaded_models, cfg.scheduler, cfg.aging_divisor_s, cfg.swap_affinity_bonus) == (2, "fifo", 30.0, 0)
    assert cfg.load_timeout_s == 600.0
    assert cfg.resolve("tiny") == "smol" and cfg.resolve("other") == "other" and cfg.resolve("nope") is None
    assert cfg.preload == ()  # loaded on demand


def test_defaults_are_the_seeds(folder: Path) -> None:
    cfg = load_config(write(folder, "models:\n  a:\n    model: smol.gguf\n"))
    assert (cfg.max_loaded_models, cfg.scheduler, cfg.aging_divisor_s, cfg.swap_affinity_bonus) == (1, "serial", 60.0, 10)
    assert cfg.load_timeout_s == 120.0  # llama-swap's healthCheckTimeout default


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("models:\n  a:\n    model: smol.gguf\n    max_batch: 0\n", ":4: models.a.max_batch: must be between 1 and 64, got 0"),
        ("models:\n  a:\n    model: smol.gguf\n    ctx_size: big\n", ":4: models.a.ctx_size: must be an integer, got 'big'"),
        ("models:\n  a:\n    model: smol.gguf\n    ttl: -2\n", ":4: models.a.ttl: must be 0 or more (or -1: globalTTL), got -2"),
        # NaN passed every bound (a model never unloaded); infinity crashed serve with a traceback
        ("models:\n  a:\n    model: smol.gguf\n    ttl: .nan\n", ":4: models.a.ttl: must be a finite number, got '.nan'"),
        (
            "models:\n  a:\n    model: smol.gguf\nrouting:\n  scheduler:\n    settings:\n      serial:\n        agingDivisor: .inf\n",
            ":8: routing.scheduler.settings.serial.agingDivisor: must be a finite number, got '.inf'",
        ),
        ("models:\n  a:\n    model: smol.gguf\n    batch: 2\n", ":4: models.a.batch: unknown key"),
        ("models:\n  a:\n    model: nothere.gguf\n", ":3: models.a.model: no such file or directory"),
        ("models:\n  a:\n    aliases: [x]\n", ":3: models.a.model: is required"),
        ("models:\n  a:\n    model: smol.gguf\n    aliases: x\n", ":4: models.a.aliases: must be a list of names"),
        ("models:\n  a:\n    model: smol.gguf\n    aliases: [b]\n  b:\n    model: other.gguf\n", ":2: models: model name 'b' is used by both 'a' and 'b'"),
        ("models:\n  a:\n    model: smol.gguf\nmax_loaded_models: 0\n", ":4: max_loaded_models: must be at least 1, got 0"),
        ("models:\n  a:\n    model: smol.gguf\nhealthCheckTimeout: .inf\n", ":4: healthCheckTimeout: must be a finite number, got '.inf'"),
        ("models:\n  a:\n    model: smol.gguf\nrouting:\n  scheduler:\n    use: lifo\n", ":6: routing.scheduler.use: must be serial or fifo, got 'lifo'"),
        (
            "models:\n  a:\n    model: smol.gguf\nrouting:\n  scheduler:\n    settings:\n      serial:\n        swapAffinityBonus: 100\n",
            ":8: routing.scheduler.settings.serial.swapAffinityBonus: must be between 0 and 99, got 100",
        ),
        (
            "models:\n  a:\n    model: smol.gguf\nrouting:\n  scheduler:\n    settings:\n      serial:\n        agingdivisor: 5\n",
            ":8: routing.scheduler.settings.serial.agingdivisor: unknown key (expected one of agingDivisor, swapAffinityBonus)",
        ),
        # an integer too large for a float: OverflowError and a traceback, no line nor key
        pytest.param("models:\n  a:\n    model: smol.gguf\n    ttl: 1" + "0" * 400 + "\n", ":4: models.a.ttl: must be a finite number", id="ttl-too-large-for-a-float"),
        ("models:\n  a:\n    model: smol.gguf\nmax_loaded: 2\n", ":4: max_loaded: unknown key"),
        ("models: {}\n", ":1: models: names no model"),
        ("models:\n  a:\n    model: smol.gguf\n  a:\n    model: other.gguf\n", ":4: models.a: is given twice"),
        ("models:\n  a: [\n", ":3: not valid YAML"),
        ("", "models: is required"),
    ],
)
def test_a_bad_file_names_the_line_and_the_key(folder: Path, text: str, expected: str) -> None:
    path = write(folder, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(str(path))
    assert expected in str(err.value)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_any_text_is_a_config_or_a_config_error(text: str) -> None:
    try:
        parse_config(text, "f.yaml", Path("/"), check_path=lambda p: None)
    except ConfigError as exc:
        assert str(exc).startswith("f.yaml")


def test_model_flags_one_is_todays_server_several_are_served_by_file_name(tmp_path: Path) -> None:
    one = from_model_paths([tmp_path / "smol.gguf"], lambda p: p.stem, model_name="chat")
    assert [m.id for m in one.models] == ["chat"] and one.preload == ("chat",)
    two = from_model_paths([tmp_path / "a.gguf", tmp_path / "b.gguf"], lambda p: p.stem)
    assert [m.id for m in two.models] == ["a", "b"] and two.preload == () and two.max_loaded_models == 1
    with pytest.raises(ConfigError, match="both be served as 'a'"):
        from_model_paths([tmp_path / "a.gguf", tmp_path / "x" / "a.gguf"], lambda p: p.stem)


def test_serve_stops_at_start_with_the_files_line_and_key(folder: Path) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    path = write(folder, "models:\n  a:\n    model: smol.gguf\n    max_batch: 99\n")
    with pytest.raises(CommandError, match=r"superfluid.yaml:4: models.a.max_batch: must be between 1 and 64, got 99"):
        call_command("serve", "--config", str(path))
    # a file that is not a model for the engine is named too (checked before any worker starts)
    path = write(folder, "models:\n  a:\n    model: smol.gguf\n")
    with pytest.raises(CommandError, match=r"superfluid.yaml:3: models.a.model: --engine mlx needs an MLX model folder"):
        call_command("serve", "--config", str(path), "--engine", "mlx")
    with pytest.raises(CommandError, match="leave out --model"):
        call_command("serve", "--config", str(path), "--model", str(folder / "smol.gguf"))
    with pytest.raises(CommandError, match="leave out --model-name"):  # it was ignored
        call_command("serve", "--config", str(path), "--model-name", "chat")
    (folder / "x").mkdir()
    (folder / "x" / "smol.gguf").write_bytes(b"GGUF")
    with pytest.raises(CommandError, match="both be served as 'smol'"):
        call_command("serve", "--model", str(folder / "smol.gguf"), "--model", str(folder / "x" / "smol.gguf"))
    with pytest.raises(CommandError, match="--socket links one worker"):
        call_command("serve", "--config", write(folder, "models:\n  a:\n    model: smol.gguf\n"), "--socket", str(folder / "s.sock"))


# -- serve --fim-model: a second resident model for fill-in-the-middle ---------------------------


def test_a_fim_model_is_added_beside_the_main_one_resident_from_the_start(folder: Path) -> None:
    main = from_model_paths([folder / "smol.gguf"], lambda p: p.stem)
    cfg = with_fim_model(main, folder / "other.gguf", lambda p: p.stem, max_batch=2, max_context=8192)
    fim = cfg.get("other")
    assert (fim.fim, fim.max_batch, fim.ctx_size, fim.ttl_s) == (True, 2, 8192, 0.0)
    assert cfg.fim_model == "other" and cfg.preload == ("smol", "other")
    assert fim.spec().pinned and not cfg.get("smol").spec().pinned
    # fill-in-the-middle goes to it whatever model the request names; anything else as named
    assert cfg.route("smol", fim=True) == "other" and cfg.route("smol", fim=False) == "smol"
    assert cfg.route("other", fim=False) == "other"
    assert main.fim_model is None and main.route("smol", fim=True) == "smol"


def test_the_same_file_as_fim_model_gets_its_own_id(folder: Path) -> None:
    main = load_config(write(folder, "models:\n  smol:\n    model: smol.gguf\n    aliases: [smol-fim]\n"))
    cfg = with_fim_model(main, folder / "smol.gguf", lambda p: p.stem, max_batch=2, max_context=4096)
    assert [m.id for m in cfg.models] == ["smol", "smol-fim-2"]
    assert cfg.resolve("smol-fim") == "smol" and cfg.fim_model == "smol-fim-2"


@pytest.mark.parametrize(("batch", "ctx", "flag"), [(0, 4096, "--fim-max-batch"), (65, 4096, "--fim-max-batch"), (2, 8193, "--fim-max-context"), (2, 63, "--fim-max-context")])
def test_fim_bounds_are_clear_errors(folder: Path, batch: int, ctx: int, flag: str) -> None:
    main = from_model_paths([folder / "smol.gguf"], lambda p: p.stem)
    with pytest.raises(ConfigError, match=flag):
        with_fim_model(main, folder / "other.gguf", lambda p: p.stem, max_batch=batch, max_context=ctx)


def test_serve_wires_the_fim_model_with_its_own_lanes_and_context(folder: Path) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from scheduler.management.commands.serve import Command

    cmd = Command()
    parser = cmd.create_parser("manage.py", "serve")
    smol = str(folder / "smol.gguf")
    options = vars(parser.parse_args(["--model", smol, "--fim-model", str(folder / "other.gguf"), "--class-lanes", "agent=6"]))
    cfg = cmd._models(options)
    assert cfg is not None and [m.id for m in cfg.models] == ["smol", "other"]
    setup = cmd._pool_setup(cfg, options)
    assert setup.lanes == {"smol": 8, "other": 2}  # --fim-max-batch 2 by default
    assert setup.ctx_sizes == {"smol": 4096, "other": 4096}  # --ctx-size, at most 8192
    options = vars(parser.parse_args(["--model", smol, "--fim-model", smol, "--fim-max-batch", "3", "--fim-max-context", "8192"]))
    setup = cmd._pool_setup(cmd._models(options), options)  # type: ignore[arg-type]
    assert (setup.lanes, setup.ctx_sizes) == ({"smol": 8, "smol-fim": 3}, {"smol": 4096, "smol-fim": 8192})
    for bad, match in ((["--fim-max-context", "16384"], "--fim-max-context must be between 64 and 8192, got 16384"),
                       (["--fim-max-batch", "0"], "--fim-max-batch must be between 1 and 64, got 0")):
        with pytest.raises(CommandError, match=match):
            call_command("serve", "--model", smol, "--fim-model", smol, *bad)
    with pytest.raises(CommandError, match="no such file"):
        call_command("serve", "--model", smol, "--fim-model", str(folder / "missing.gguf"))


@pytest.mark.parametrize(("engine", "fim", "message"), [
    ("auto", "missing.gguf", "--fim-model .*missing.gguf: no such file or directory"),
    ("auto", ".", "--fim-model .*: not a GGUF file nor an MLX model folder"),
    ("llamacpp", ".", "--engine llamacpp needs a GGUF file; --fim-model .* is neither"),
])
def test_a_fim_model_that_cannot_be_served_is_named_by_its_own_flag(folder: Path, engine: str, fim: str, message: str) -> None:
    """A wrong --fim-model (or SUPERFLUID_FIM_MODEL) was reported as "--model PATH: no such file or
    directory": the operator looked for a --model nobody had given."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=message) as err:
        call_command("serve", "--model", str(folder / "smol.gguf"), "--engine", engine, "--fim-model", str(folder / fim) if fim != "." else str(folder), "--no-engine")
    assert "--model " not in str(err.value)


def test_a_fractional_aging_divisor_reaches_every_worker_as_the_router_has_it(folder: Path) -> None:
    """agingDivisor 0.5 is half a second of waiting per priority point at the router and in each
    model's worker alike (the worker flag once rounded it to 1 s)."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from scheduler.management.commands.runengine import Command as RunEngine
    from scheduler.management.commands.serve import Command
    from scheduler.management.options import scheduler_config

    path = write(folder, "models:\n  a:\n    model: smol.gguf\n  b:\n    model: other.gguf\nrouting:\n  scheduler:\n    settings:\n      serial:\n        agingDivisor: 0.5\n")
    cmd = Command()
    parser = cmd.create_parser("manage.py", "serve")
    options = vars(parser.parse_args(["--config", str(path)]))
    cfg = cmd._models(options)
    assert cfg is not None and cfg.router_config().aging_divisor_s == 0.5
    setup = cmd._pool_setup(cfg, options)
    for model in ("a", "b"):
        argv = setup.spawn(model, None).argv
        worker = vars(RunEngine().create_parser("manage.py", "runengine").parse_args([*argv[argv.index("runengine") + 1 :], "--link-fd", "3"]))
        assert scheduler_config(worker).aging_divisor_s == 0.5
    for bad in ("nan", "inf", "-1"):
        with pytest.raises(CommandError, match="--aging-divisor must be 0"):
            call_command("serve", "--model", str(folder / "smol.gguf"), "--aging-divisor", bad)
