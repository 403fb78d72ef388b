"""MLX on Linux multiplies through the system's OpenBLAS when one is installed (``.ci/run`` and
the README's test command install Debian's), and keeps its bundled BLAS when told to. Each case
runs in a fresh interpreter: the choice is made once, before ``mlx.core`` is first imported."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
from scheduler.engines.mlx_runtime import blas_in_use, mlx_core
mx = mlx_core()
a = mx.array([[1.0, 2.0], [3.0, 4.0]])
print(blas_in_use())
print((a @ a.T).tolist())
print(any('/libopenblas' in line for line in open('/proc/self/maps')))
"""


def probe(**env: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout.splitlines()


@pytest.mark.skipif(sys.platform != "linux", reason="the bundled reference BLAS is the Linux wheel's")
def test_mlx_multiplies_through_openblas_when_installed_and_its_own_blas_when_told() -> None:
    if ctypes.util.find_library("openblas") is None:
        if os.environ.get("CI"):
            pytest.fail("OpenBLAS is not installed (.ci/run installs libopenblas0)")
        pytest.skip("no OpenBLAS on this machine")
    used, product, mapped = probe()
    assert used.startswith("system OpenBLAS") and mapped == "True"
    assert product == "[[5.0, 11.0], [11.0, 25.0]]"
    used, product, mapped = probe(SUPERFLUID_MLX_SYSTEM_BLAS="0")
    assert used == "the BLAS bundled with mlx" and mapped == "False"
    assert product == "[[5.0, 11.0], [11.0, 25.0]]"
