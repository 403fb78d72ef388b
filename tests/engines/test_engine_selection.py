"""Which engine serves a model: by what the model is, or as --engine forces, with a message
that says why when it cannot."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management.base import CommandError

from scheduler.engines.base import busy_tick_target_s
from scheduler.management.options import choose_engine


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    return path


@pytest.fixture
def mlx_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "model-mlx"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def test_auto_picks_llamacpp_for_a_gguf_file_and_mlx_for_an_mlx_folder(gguf: Path, mlx_dir: Path) -> None:
    assert choose_engine("auto", gguf) == "llamacpp"
    assert choose_engine("auto", mlx_dir) == "mlx"


def test_a_forced_engine_that_fits_the_model_is_taken(gguf: Path, mlx_dir: Path) -> None:
    assert choose_engine("llamacpp", gguf) == "llamacpp"
    assert choose_engine("mlx", mlx_dir) == "mlx"
    other = gguf.with_suffix(".bin")
    gguf.rename(other)
    assert choose_engine("llamacpp", other) == "llamacpp"  # llama.cpp itself judges the file


def test_forcing_an_engine_on_the_wrong_kind_of_model_says_what_it_needs(gguf: Path, mlx_dir: Path) -> None:
    with pytest.raises(CommandError, match=r"--engine mlx needs an MLX model folder .*mlxconvert.* is a GGUF file"):
        choose_engine("mlx", gguf)
    with pytest.raises(CommandError, match=r"--engine llamacpp needs a GGUF file; .* is an MLX model folder"):
        choose_engine("llamacpp", mlx_dir)


def test_a_folder_without_weights_and_an_unknown_engine_are_refused(tmp_path: Path, gguf: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CommandError, match="not a GGUF file nor an MLX model folder"):
        choose_engine("auto", tmp_path / "empty")
    with pytest.raises(CommandError, match="--engine must be auto, llamacpp or mlx"):
        choose_engine("vllm", gguf)


def test_runengine_turns_a_model_mlx_cannot_load_into_a_command_error(mlx_dir: Path) -> None:
    from scheduler.management.commands.runengine import load_engine

    with pytest.raises(CommandError, match="--engine mlx cannot load"):
        load_engine("mlx", mlx_dir, n_lanes=1, lane_ctx=64, threads=0, cache_slots=0)


def test_llamacpp_and_mlx_declare_the_seeds_busy_tick_target() -> None:
    assert busy_tick_target_s("llamacpp") == busy_tick_target_s("mlx") == 0.25
    assert busy_tick_target_s("sim") is None


def test_serve_stops_before_starting_anything_when_the_forced_engine_cannot_take_the_model() -> None:
    from django.core.management import call_command

    with pytest.raises(CommandError, match="--engine mlx needs an MLX model folder"):
        call_command("serve", "--engine", "mlx")  # the default model is the bundled GGUF
