"""MLX on Linux multiplies through the system's OpenBLAS when one is installed (``.ci/run`` and
the README's test command install Debian's), keeps its bundled BLAS when told to, and
``checkengine`` says which. Each case runs in a fresh interpreter: the choice is made once,
before ``mlx.core`` is first imported."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.harness import ROOT

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


def require_openblas() -> None:
    if sys.platform != "linux":
        pytest.skip("the bundled reference BLAS is the Linux wheel's")
    if ctypes.util.find_library("openblas") is None:
        if os.environ.get("CI"):
            pytest.fail("OpenBLAS is not installed (.ci/run installs libopenblas0)")
        pytest.skip("no OpenBLAS on this machine")


def test_mlx_multiplies_through_openblas_when_installed_and_its_own_blas_when_told() -> None:
    require_openblas()
    used, product, mapped = probe()
    assert used.startswith("system OpenBLAS") and mapped == "True"
    assert product == "[[5.0, 11.0], [11.0, 25.0]]"
    used, product, mapped = probe(SUPERFLUID_MLX_SYSTEM_BLAS="0")
    assert used == "the BLAS bundled with mlx" and mapped == "False"
    assert product == "[[5.0, 11.0], [11.0, 25.0]]"


@pytest.mark.model
def test_checkengine_names_the_blas_of_an_mlx_model(mlx_float_dir: Path, tmp_path: Path) -> None:
    require_openblas()
    argv = [sys.executable, "manage.py", "checkengine", "--model", str(mlx_float_dir), "--max-batch", "1", "--rounds", "2"]
    env = {**os.environ, "SUPERFLUID_DATA_DIR": str(tmp_path)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MLX multiplies through system OpenBLAS" in done.stdout, done.stdout
    assert "on mlx: loaded in" in done.stdout and "decode" in done.stdout
