"""serve --config files the e2e tests and the benchmarks both serve."""

from __future__ import annotations

from pathlib import Path


def two_models_config(
    smol: Path,
    gemma: Path,
    *,
    max_batch: int = 2,
    ctx_size: int = 1024,
    gemma_ttl_s: int = 0,
    max_loaded: int = 1,
    swap_affinity_bonus: int | None = None,
) -> str:
    """SmolLM2 as ``smol`` (alias ``small``) and Gemma as ``gemma`` (alias ``g3``), each with
    ``max_batch`` lanes of ``ctx_size`` tokens. With ``swap_affinity_bonus`` the router is the
    request-priority seed's serial scheduler with that bonus (aging divisor 60); without it, the
    default router settings."""
    routing = ""
    if swap_affinity_bonus is not None:
        routing = f"""\
routing:
  scheduler:
    use: serial
    settings:
      serial:
        agingDivisor: 60
        swapAffinityBonus: {swap_affinity_bonus}
"""
    return f"""\
models:
  smol:
    model: {smol}
    aliases: [small]
    max_batch: {max_batch}
    ctx_size: {ctx_size}
  gemma:
    model: {gemma}
    aliases: [g3]
    max_batch: {max_batch}
    ctx_size: {ctx_size}
    ttl: {gemma_ttl_s}
max_loaded_models: {max_loaded}
{routing}"""
