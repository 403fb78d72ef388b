"""Build an MLX model directory from a GGUF file, so the MLX engine can serve the same model."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Convert a llama GGUF (default: the bundled SmolLM2-135M) into an MLX model directory."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--gguf", default="", help="GGUF file (default: the bundled SmolLM2-135M-Instruct)")
        parser.add_argument("--out", default="", help="output folder (default: ~/.cache/superfluid/mlx/<name>-mlx)")
        parser.add_argument("--force", action="store_true", help="replace the output folder if it exists")
        from scheduler.engines.mlx_convert import DTYPES  # plain Python: needs neither mlx nor tokenizers

        parser.add_argument(
            "--dtype",
            choices=DTYPES,
            default=None,
            help="write every weight dequantised to this type (default: keep the GGUF's quantised weights). "
            "float32 is the fast choice on MLX's CPU backend (Linux) with OpenBLAS installed; keep the default on Apple silicon",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            from scheduler.engines.mlx_convert import ConversionError, convert_gguf, default_mlx_dir
        except ImportError as exc:
            raise CommandError(f"mlxconvert needs mlx and tokenizers: pip install 'mlx[cpu]' mlx-lm ({exc})") from None
        from scheduler.engines.models import default_model_path

        gguf = Path(options["gguf"]).expanduser() if options["gguf"] else default_model_path()
        out = Path(options["out"]).expanduser() if options["out"] else default_mlx_dir(gguf)
        started = time.monotonic()
        existed = out.exists()
        try:
            path = convert_gguf(gguf, out, force=options["force"], dtype=options["dtype"])
        except (ConversionError, FileNotFoundError) as exc:
            raise CommandError(str(exc)) from None
        verb = "kept" if existed and not options["force"] else f"wrote in {time.monotonic() - started:.1f}s"
        self.stdout.write(f"{path} ({verb})\nserve it with: python manage.py serve --model {path}\n")
