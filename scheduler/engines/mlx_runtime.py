"""Importing MLX, with a fast BLAS on Linux.

The ``mlx[cpu]`` wheel for Linux links the reference (netlib) BLAS that it bundles. MLX's CPU
backend runs every float matrix product through ``cblas_sgemm``, and the reference one is a
plain triple loop: on the 2-core Xeon of docs/benchmarks.md a 1024x1024 product took 407 ms
against 7.4 ms through OpenBLAS. When the system has OpenBLAS (Debian: ``libopenblas0``), it is
loaded into the process's global symbol scope before ``mlx.core`` is first imported, so MLX's
``cblas_*`` calls bind to it instead of the bundled library. Without it, or with
``SUPERFLUID_MLX_SYSTEM_BLAS=0``, MLX runs as shipped.

Quantised weights do not go through BLAS (MLX's CPU kernel for them is its own); float weights
do: ``mlxconvert --dtype float32`` writes those (docs/engines.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from types import ModuleType

from superfluid_site.env import env_bool

log = logging.getLogger("superfluid.engine")

_blas: str | None = None  # the library loaded in front of mlx's bundled BLAS, if any
_tried = False


def mlx_core() -> ModuleType:
    """``mlx.core``, imported after putting the system's OpenBLAS first (once per process, and
    only if nothing imported mlx before: a symbol already bound stays where it is)."""
    global _blas, _tried
    if not _tried and "mlx.core" not in sys.modules and sys.platform == "linux" and env_bool("SUPERFLUID_MLX_SYSTEM_BLAS", True):
        _tried = True
        name = ctypes.util.find_library("openblas")
        if name:
            try:
                ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
                _blas = name
            except OSError as exc:  # found by ldconfig, not loadable (a broken install)
                log.warning("OpenBLAS (%s) did not load; MLX keeps its bundled BLAS: %s", name, exc)
    import mlx.core as mx

    return mx


def blas_in_use() -> str:
    """What MLX's matrix products run on in this process (``checkengine``, ``bench/engines.py``)."""
    if _blas is not None:
        return f"system OpenBLAS ({_blas})"
    return "the BLAS bundled with mlx"
