"""serve --config: an error about a model's lanes, context or file names what the operator wrote
(the file's key), not a flag nobody gave: "lower --ctx-size" for a file's ctx_size, which the
flag does not change, or "--model PATH" for a file's ``model``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.management.base import CommandError

from scheduler.management.commands.serve import Command


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "smol.gguf").write_bytes(b"GGUF")
    return tmp_path


def setup_for(folder: Path, text: str, *flags: str) -> Any:
    path = folder / "superfluid.yaml"
    path.write_text(text)
    cmd = Command()
    options = vars(cmd.create_parser("manage.py", "serve").parse_args(["--config", str(path), *flags]))
    cfg = cmd._models(options)
    assert cfg is not None
    return cmd._pool_setup(cfg, options)


def test_a_files_context_too_big_for_one_llama_context_names_the_files_key(folder: Path) -> None:
    with pytest.raises(CommandError) as err:
        setup_for(folder, "models:\n  a:\n    model: smol.gguf\n    ctx_size: 999999999\n")
    message = str(err.value)
    assert message.startswith("model a: models.a.ctx_size 999999999 for 12 sequences (--max-batch lanes")
    assert message.endswith("lower models.a.ctx_size") and "--ctx-size" not in message
    with pytest.raises(CommandError) as err:
        setup_for(folder, "models:\n  a:\n    model: smol.gguf\n    max_batch: 4\n    ctx_size: 999999999\n")
    assert str(err.value).startswith("model a: models.a.ctx_size 999999999 for 8 sequences (models.a.max_batch lanes")


def test_the_flags_context_too_big_is_still_the_flags(folder: Path) -> None:
    with pytest.raises(CommandError, match=r"model a: --ctx-size 999999999 .*lower --ctx-size"):
        setup_for(folder, "models:\n  a:\n    model: smol.gguf\n", "--ctx-size", "999999999")


def test_a_files_model_that_is_no_model_names_no_model_flag(folder: Path) -> None:
    with pytest.raises(CommandError) as err:
        setup_for(folder, "models:\n  a:\n    model: .\n")
    assert "models.a.model:" in str(err.value) and "not a GGUF file nor an MLX model folder" in str(err.value)
    assert "--model" not in str(err.value)
    with pytest.raises(CommandError) as err:
        setup_for(folder, "models:\n  a:\n    model: .\n", "--engine", "llamacpp")
    assert "--engine llamacpp needs a GGUF file" in str(err.value) and "--model" not in str(err.value)


def test_a_fim_models_context_too_big_names_its_own_flag(folder: Path) -> None:
    smol = str(folder / "smol.gguf")
    cmd = Command()
    options = vars(cmd.create_parser("manage.py", "serve").parse_args(
        ["--model", smol, "--fim-model", smol, "--fim-max-context", "8192", "--prefix-cache-slots", "600000"]))
    cfg = cmd._models(options)
    assert cfg is not None
    with pytest.raises(CommandError) as err:
        cmd._pool_setup(cfg, options)
    message = str(err.value)
    assert message.startswith("model smol-fim: --fim-max-context 8192 for 600002 sequences (--fim-max-batch lanes")
    assert message.endswith("lower --fim-max-context") and "--ctx-size" not in message
